//! `cargo xtask msrv`: the minimum Rust version each workspace crate claims
//! (`rust-version`) is at least the highest one that any of its locked dependencies
//! declares, and the README states the root crate's.
//!
//! The packages and the graph come from `cargo metadata --format-version 1 --locked`:
//! every package in `Cargo.lock` with its `rust-version`, and the resolved dependencies
//! of each (all features, every platform). A crate's claim covers what a user of it
//! compiles: its normal and build dependencies, transitively; dev-dependencies (the
//! test suite's own needs) are reported, not checked.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};

use crate::{cargo, root};

/// `cargo xtask msrv`.
pub fn command(args: &[String]) -> i32 {
    if !args.is_empty() {
        eprintln!("xtask msrv: takes no options");
        return 2;
    }
    check()
}

/// Runs the check and prints what it found; the exit code (0 when every claim holds).
pub fn check() -> i32 {
    let mut cmd: Command = cargo();
    cmd.args(["metadata", "--format-version", "1", "--locked"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    eprintln!("xtask: running cargo metadata --format-version 1 --locked");
    let out = match cmd.output() {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => {
            eprintln!("xtask msrv: cargo metadata failed ({})", o.status);
            return 1;
        }
        Err(e) => {
            eprintln!("xtask msrv: could not run cargo metadata: {e}");
            return 1;
        }
    };
    let text = String::from_utf8_lossy(&out);
    let graph = match Graph::parse(&text) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("xtask msrv: cannot read cargo metadata's output: {e}");
            return 1;
        }
    };
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap_or_default();
    let report = graph.check(&readme);
    for line in &report.lines {
        println!("xtask msrv: {line}");
    }
    for problem in &report.problems {
        eprintln!("xtask msrv: FAILED: {problem}");
    }
    i32::from(!report.problems.is_empty())
}

/// A `rust-version`: `1.88` or `1.88.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RustVersion(u32, u32, u32);

impl RustVersion {
    pub fn parse(s: &str) -> Option<RustVersion> {
        let mut parts = s.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        if parts.next().is_some() {
            return None;
        }
        Some(RustVersion(major, minor, patch))
    }
}

impl std::fmt::Display for RustVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.2 == 0 {
            write!(f, "{}.{}", self.0, self.1)
        } else {
            write!(f, "{}.{}.{}", self.0, self.1, self.2)
        }
    }
}

#[derive(Debug)]
struct Package {
    name: String,
    version: String,
    rust_version: Option<RustVersion>,
}

/// The packages of the lock file and the resolved graph.
#[derive(Debug)]
pub struct Graph {
    packages: BTreeMap<String, Package>,
    members: Vec<String>,
    /// Package id -> (dependency id, whether it is only a dev-dependency).
    deps: BTreeMap<String, Vec<(String, bool)>>,
    /// The root package (the crate the README describes), if any.
    root: Option<String>,
}

/// What the check found.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
    pub problems: Vec<String>,
}

impl Graph {
    pub fn parse(text: &str) -> Result<Graph, String> {
        let v = json::parse(text)?;
        let mut packages = BTreeMap::new();
        for p in v
            .get("packages")
            .and_then(json::Value::as_array)
            .ok_or("no packages")?
        {
            let id = p.str_field("id").ok_or("a package without id")?;
            let rust_version = match p.get("rust_version").and_then(json::Value::as_str) {
                Some(s) => Some(
                    RustVersion::parse(s).ok_or_else(|| format!("{id}: bad rust_version {s:?}"))?,
                ),
                None => None,
            };
            packages.insert(
                id.to_string(),
                Package {
                    name: p.str_field("name").unwrap_or("?").to_string(),
                    version: p.str_field("version").unwrap_or("?").to_string(),
                    rust_version,
                },
            );
        }
        let members = v
            .get("workspace_members")
            .and_then(json::Value::as_array)
            .ok_or("no workspace_members")?
            .iter()
            .filter_map(|m| m.as_str().map(str::to_string))
            .collect();
        let mut deps = BTreeMap::new();
        let nodes = v
            .get("resolve")
            .and_then(|r| r.get("nodes"))
            .and_then(json::Value::as_array)
            .ok_or("no resolve graph (was --no-deps given?)")?;
        for node in nodes {
            let id = node.str_field("id").ok_or("a node without id")?;
            let mut out = Vec::new();
            for d in node
                .get("deps")
                .and_then(json::Value::as_array)
                .unwrap_or(&[])
            {
                let pkg = d.str_field("pkg").ok_or("a dependency without pkg")?;
                let kinds = d
                    .get("dep_kinds")
                    .and_then(json::Value::as_array)
                    .unwrap_or(&[]);
                let dev_only = !kinds.is_empty()
                    && kinds
                        .iter()
                        .all(|k| k.get("kind").and_then(json::Value::as_str) == Some("dev"));
                out.push((pkg.to_string(), dev_only));
            }
            deps.insert(id.to_string(), out);
        }
        let root = v
            .get("resolve")
            .and_then(|r| r.get("root"))
            .and_then(json::Value::as_str)
            .map(str::to_string);
        Ok(Graph {
            packages,
            members,
            deps,
            root,
        })
    }

    /// Every package `from` needs: normal and build dependencies, transitively; with
    /// `dev`, also `from`'s own dev-dependencies (and what they need).
    fn reachable(&self, from: &str, dev: bool) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![(from.to_string(), true)];
        while let Some((id, first)) = stack.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            for (dep, dev_only) in self.deps.get(&id).into_iter().flatten() {
                if !dev_only || (first && dev) {
                    stack.push((dep.clone(), false));
                }
            }
        }
        seen.remove(from);
        seen
    }

    /// The highest `rust-version` among `ids`, with the packages that declare it.
    fn highest(&self, ids: &BTreeSet<String>) -> Option<(RustVersion, Vec<String>)> {
        let mut best: Option<(RustVersion, Vec<String>)> = None;
        for id in ids {
            let p = &self.packages[id];
            let Some(rv) = p.rust_version else { continue };
            let who = format!("{} {}", p.name, p.version);
            match &mut best {
                Some((b, names)) if *b == rv => names.push(who),
                Some((b, _)) if *b > rv => {}
                _ => best = Some((rv, vec![who])),
            }
        }
        best
    }

    pub fn check(&self, readme: &str) -> Report {
        let mut report = Report::default();
        for member in &self.members {
            let p = &self.packages[member];
            let Some(claim) = p.rust_version else {
                report
                    .lines
                    .push(format!("{}: no rust-version (not checked)", p.name));
                continue;
            };
            let needed = self.reachable(member, false);
            let too_new: Vec<String> = needed
                .iter()
                .filter_map(|id| {
                    let d = &self.packages[id];
                    d.rust_version
                        .filter(|rv| *rv > claim)
                        .map(|rv| format!("{} {} (rust-version {rv})", d.name, d.version))
                })
                .collect();
            let highest = self
                .highest(&needed)
                .map_or("none declared".to_string(), |(rv, who)| {
                    format!("{rv} ({})", few(&who))
                });
            let tests = self
                .highest(&self.reachable(member, true))
                .map_or("none declared".to_string(), |(rv, who)| {
                    format!("{rv} ({})", few(&who))
                });
            report.lines.push(format!(
                "{}: rust-version {claim}; highest of its {} dependencies: {highest}; \
                 with dev-dependencies: {tests}",
                p.name,
                needed.len()
            ));
            if !too_new.is_empty() {
                report.problems.push(format!(
                    "{} claims rust-version {claim}, but locked dependencies need more: {}. \
                     Raise rust-version in {}'s Cargo.toml (and the README) or pin older versions",
                    p.name,
                    too_new.join(", "),
                    p.name
                ));
            }
        }
        if let Some(root) = &self.root {
            let p = &self.packages[root];
            if let Some(claim) = p.rust_version {
                let stated = format!("Rust {claim}");
                if !readme.contains(&format!("{stated}**"))
                    && !readme.contains(&format!("{stated} "))
                {
                    report.problems.push(format!(
                        "README.md does not state \"{stated}\" (the rust-version of {})",
                        p.name
                    ));
                }
            }
        }
        report
    }
}

/// At most three names, then how many more.
fn few(names: &[String]) -> String {
    match names.len() {
        0..=3 => names.join(", "),
        n => format!("{} and {} more", names[..3].join(", "), n - 3),
    }
}

/// Just enough JSON for `cargo metadata` (std only, as the rest of xtask).
pub mod json {
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        Null,
        Bool(bool),
        Number(f64),
        String(String),
        Array(Vec<Value>),
        Object(BTreeMap<String, Value>),
    }

    impl Value {
        pub fn get(&self, key: &str) -> Option<&Value> {
            match self {
                Value::Object(m) => m.get(key),
                _ => None,
            }
        }

        pub fn as_str(&self) -> Option<&str> {
            match self {
                Value::String(s) => Some(s),
                _ => None,
            }
        }

        pub fn as_array(&self) -> Option<&[Value]> {
            match self {
                Value::Array(a) => Some(a),
                _ => None,
            }
        }

        pub fn str_field(&self, key: &str) -> Option<&str> {
            self.get(key).and_then(Value::as_str)
        }
    }

    pub fn parse(text: &str) -> Result<Value, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing characters at byte {}", p.i));
        }
        Ok(v)
    }

    struct Parser<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Parser<'_> {
        fn ws(&mut self) {
            while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
        }

        fn err<T>(&self, what: &str) -> Result<T, String> {
            Err(format!("{what} at byte {}", self.i))
        }

        fn eat(&mut self, lit: &str) -> bool {
            if self.s[self.i..].starts_with(lit.as_bytes()) {
                self.i += lit.len();
                true
            } else {
                false
            }
        }

        fn value(&mut self) -> Result<Value, String> {
            self.ws();
            match self.s.get(self.i) {
                None => self.err("unexpected end"),
                Some(b'{') => {
                    self.i += 1;
                    let mut m = BTreeMap::new();
                    self.ws();
                    if self.eat("}") {
                        return Ok(Value::Object(m));
                    }
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.ws();
                        if !self.eat(":") {
                            return self.err("expected ':'");
                        }
                        let v = self.value()?;
                        m.insert(k, v);
                        self.ws();
                        if self.eat(",") {
                            continue;
                        }
                        if self.eat("}") {
                            return Ok(Value::Object(m));
                        }
                        return self.err("expected ',' or '}'");
                    }
                }
                Some(b'[') => {
                    self.i += 1;
                    let mut a = Vec::new();
                    self.ws();
                    if self.eat("]") {
                        return Ok(Value::Array(a));
                    }
                    loop {
                        a.push(self.value()?);
                        self.ws();
                        if self.eat(",") {
                            continue;
                        }
                        if self.eat("]") {
                            return Ok(Value::Array(a));
                        }
                        return self.err("expected ',' or ']'");
                    }
                }
                Some(b'"') => Ok(Value::String(self.string()?)),
                Some(_) if self.eat("true") => Ok(Value::Bool(true)),
                Some(_) if self.eat("false") => Ok(Value::Bool(false)),
                Some(_) if self.eat("null") => Ok(Value::Null),
                Some(_) => {
                    let start = self.i;
                    while self.i < self.s.len()
                        && matches!(
                            self.s[self.i],
                            b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                        )
                    {
                        self.i += 1;
                    }
                    let n = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                    match n.parse() {
                        Ok(n) => Ok(Value::Number(n)),
                        Err(_) => self.err("unexpected character"),
                    }
                }
            }
        }

        fn hex4(&mut self) -> Result<u32, String> {
            let h = self
                .s
                .get(self.i..self.i + 4)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok());
            match h {
                Some(h) => {
                    self.i += 4;
                    Ok(h)
                }
                None => self.err("bad \\u escape"),
            }
        }

        fn string(&mut self) -> Result<String, String> {
            if !self.eat("\"") {
                return self.err("expected a string");
            }
            let mut out = Vec::new();
            loop {
                let Some(&c) = self.s.get(self.i) else {
                    return self.err("unterminated string");
                };
                self.i += 1;
                match c {
                    b'"' => break,
                    b'\\' => {
                        let Some(&e) = self.s.get(self.i) else {
                            return self.err("unterminated escape");
                        };
                        self.i += 1;
                        let ch = match e {
                            b'"' => '"',
                            b'\\' => '\\',
                            b'/' => '/',
                            b'b' => '\u{8}',
                            b'f' => '\u{c}',
                            b'n' => '\n',
                            b'r' => '\r',
                            b't' => '\t',
                            b'u' => {
                                let hi = self.hex4()?;
                                let code = if (0xD800..0xDC00).contains(&hi) && self.eat("\\u") {
                                    let lo = self.hex4()?;
                                    0x10000
                                        + ((hi - 0xD800) << 10)
                                        + (lo.wrapping_sub(0xDC00) & 0x3FF)
                                } else {
                                    hi
                                };
                                char::from_u32(code).unwrap_or('\u{FFFD}')
                            }
                            _ => return self.err("bad escape"),
                        };
                        let mut buf = [0; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                    }
                    c => out.push(c),
                }
            }
            String::from_utf8(out).map_err(|_| "a string is not UTF-8".to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_number() {
        let v = |s| RustVersion::parse(s).unwrap();
        assert!(v("1.88") > v("1.85.0"));
        assert!(v("1.100") > v("1.99"));
        assert_eq!(v("1.88"), v("1.88.0"));
        assert_eq!(v("1.88.1").to_string(), "1.88.1");
        assert_eq!(v("1.88.0").to_string(), "1.88");
        assert_eq!(RustVersion::parse("1.x"), None);
    }

    #[test]
    fn json_reads_what_cargo_writes() {
        let v =
            json::parse(r#" {"a": [1, -2.5e3, true, null, "x\"\u00e9\ud83d\ude00"], "b": {}} "#)
                .unwrap();
        let a = v.get("a").and_then(json::Value::as_array).unwrap();
        assert_eq!(a[1], json::Value::Number(-2500.0));
        assert_eq!(a[4].as_str(), Some("x\"é😀"));
        assert!(json::parse("{\"a\": }").is_err());
        assert!(json::parse("[1] x").is_err());
    }

    /// A crate claiming 1.80 with a normal dependency at 1.88 (through another) and a
    /// dev-dependency at 1.90.
    const METADATA: &str = r#"{
      "packages": [
        {"id": "me", "name": "me", "version": "0.1.0", "rust_version": "1.80"},
        {"id": "a", "name": "a", "version": "1.0.0", "rust_version": null},
        {"id": "tonic", "name": "tonic", "version": "0.14.9", "rust_version": "1.88"},
        {"id": "crit", "name": "crit", "version": "0.5.0", "rust_version": "1.90"},
        {"id": "xtask", "name": "xtask", "version": "0.0.0", "rust_version": null}
      ],
      "workspace_members": ["me", "xtask"],
      "resolve": {
        "root": "me",
        "nodes": [
          {"id": "me", "deps": [
            {"pkg": "a", "dep_kinds": [{"kind": null, "target": null}]},
            {"pkg": "crit", "dep_kinds": [{"kind": "dev", "target": null}]}
          ]},
          {"id": "a", "deps": [{"pkg": "tonic", "dep_kinds": [{"kind": "build", "target": null}]}]},
          {"id": "tonic", "deps": []},
          {"id": "crit", "deps": []},
          {"id": "xtask", "deps": []}
        ]
      }
    }"#;

    #[test]
    fn a_dependency_newer_than_the_claim_fails_and_dev_dependencies_do_not() {
        let graph = Graph::parse(METADATA).unwrap();
        let report = graph.check("needs **Rust 1.80** or newer");
        assert_eq!(report.problems.len(), 1, "{report:?}");
        assert!(report.problems[0].contains("tonic 0.14.9 (rust-version 1.88)"));
        assert!(!report.problems[0].contains("crit"));
        assert!(report.lines[0].contains("with dev-dependencies: 1.90 (crit 0.5.0)"));

        let fixed = METADATA.replace(r#""rust_version": "1.80""#, r#""rust_version": "1.88""#);
        let graph = Graph::parse(&fixed).unwrap();
        assert!(graph.check("**Rust 1.88** or newer").problems.is_empty());
        // The README must say the same.
        let report = graph.check("**Rust 1.80** or newer");
        assert_eq!(report.problems.len(), 1);
        assert!(report.problems[0].contains("README.md"), "{report:?}");
    }
}
