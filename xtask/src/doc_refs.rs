//! `cargo xtask doc-refs`: what the docs cite exists.
//! - `` `file.rs: Item` `` or `` `file.rs: Type::item` ``: the file, an item of that name
//!   in it (`fn`, `const`, `static`, `struct`, `enum`, `trait`, `type`, `mod`,
//!   `macro_rules!`), and for `Type::item` the type defined or implemented there. The
//!   walks in docs/ARCHITECTURE.md are written that way.
//! - `` `file.rs` `` alone: a file of the workspace with that path (or ending in it).
//! - `` `Type::item` `` alone, where `Type` is defined in the workspace: an `fn`, `const`,
//!   field or variant named `item` in the workspace (a `Type` of another crate, such as
//!   etcd-client's `Client`, is not checked).
//!
//! A rename that leaves the docs behind fails the lints.
//!
//! A path is taken from the workspace root when it starts with a top-level folder
//! (`src/`, `proxy/`, `testkit/`, `xtask/`, `tests/`, `benches/`, `examples/`); otherwise
//! from `proxy/src/` under a heading that names the proxy (and everywhere in
//! docs/PROXY.md), else from `src/`. Fenced code blocks are skipped.

use std::fs;
use std::path::Path;

/// The documents checked, from the workspace root: every `docs/*.md`, these, and each
/// test suite's README.
const ALSO: &[&str] = &["README.md", "CONTRIBUTING.md"];
const TOP: &[&str] = &[
    "src/",
    "proxy/",
    "testkit/",
    "xtask/",
    "tests/",
    "benches/",
    "examples/",
];
const ITEM_KINDS: &[&str] = &[
    "fn", "const", "static", "struct", "enum", "trait", "type", "mod",
];

pub(crate) fn command(args: &[String]) -> i32 {
    if let Some(a) = args.first() {
        eprintln!("xtask doc-refs: takes no arguments (got {a})");
        return 2;
    }
    let root = crate::root();
    let mut docs = Vec::new();
    for dir in ["docs", "proxy/tests"] {
        let Ok(entries) = fs::read_dir(root.join(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if dir == "docs" && p.extension().is_some_and(|x| x == "md") {
                docs.push(p);
            } else if p.join("README.md").is_file() {
                docs.push(p.join("README.md"));
            }
        }
    }
    docs.extend(ALSO.iter().map(|d| root.join(d)));
    docs.sort();
    let tree = Tree::read(&root);
    let (mut cited, mut missing) = (0, Vec::new());
    for doc in &docs {
        let Ok(text) = fs::read_to_string(doc) else {
            continue;
        };
        let name = doc.strip_prefix(&root).unwrap_or(doc).display().to_string();
        for (line, base, span) in spans(&text, name.ends_with("PROXY.md")) {
            let found = if let Some((path, item)) = citation(&span) {
                check(&root, base, &path, &item)
            } else if is_path(&span) {
                tree.has_file(&span)
            } else if let Some((ty, item)) = member(&span) {
                tree.has_member(ty, item)
            } else {
                continue;
            };
            cited += 1;
            if let Err(why) = found {
                missing.push(format!("{name}:{line}: `{span}`: {why}"));
            }
        }
    }
    if missing.is_empty() {
        eprintln!(
            "xtask doc-refs: {cited} citations of files and items in {} documents, each found",
            docs.len()
        );
        0
    } else {
        for m in &missing {
            eprintln!("xtask doc-refs: {m}");
        }
        eprintln!(
            "xtask doc-refs: {} of {cited} citations name what does not exist (renamed or \
             gone): mend the docs",
            missing.len()
        );
        1
    }
}

/// Each backticked span outside fenced code, whitespace collapsed: (line, base folder
/// for a relative path there, span).
fn spans(text: &str, proxy_doc: bool) -> Vec<(usize, &'static str, String)> {
    let mut out = Vec::new();
    let mut base = if proxy_doc { "proxy/src/" } else { "src/" };
    let mut in_fence = false;
    // A span may continue on the next line: kept open across lines.
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            open = None;
            continue;
        }
        if in_fence {
            continue;
        }
        if line.starts_with('#') && open.is_none() {
            base = if proxy_doc || line.to_lowercase().contains("proxy") {
                "proxy/src/"
            } else {
                "src/"
            };
        }
        for (j, part) in line.split('`').enumerate() {
            if j > 0 {
                // A backtick: closes the open span, or opens one.
                match open.take() {
                    Some((at, span)) => {
                        let span = span.split_whitespace().collect::<Vec<_>>().join(" ");
                        out.push((at + 1, base, span));
                    }
                    None => open = Some((i, String::new())),
                }
            }
            if let Some((_, span)) = open.as_mut() {
                if !span.is_empty() {
                    span.push(' ');
                }
                span.push_str(part.trim());
            }
        }
        // A blank line ends a paragraph: an unpaired backtick does not run on.
        if line.trim().is_empty() {
            open = None;
        }
    }
    out
}

/// `path.rs: Item` or `path.rs: Type::item` (a span as [`spans`] gives it, whitespace
/// collapsed already).
fn citation(span: &str) -> Option<(String, String)> {
    let (path, item) = span.split_once(".rs: ")?;
    let path_ok = !path.is_empty()
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '-'));
    let item_ok = !item.is_empty()
        && item.split("::").all(|p| {
            p.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
    (path_ok && item_ok).then(|| (format!("{path}.rs"), item.to_string()))
}

/// A path to a Rust file: `a/b.rs`.
fn is_path(span: &str) -> bool {
    span.ends_with(".rs")
        && span.len() > 3
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '-'))
}

/// `Type::item` (an optional `()` after it), `Type` capitalized.
fn member(span: &str) -> Option<(&str, &str)> {
    let span = span.strip_suffix("()").unwrap_or(span);
    let (ty, item) = span.split_once("::")?;
    let ident = |w: &str| {
        w.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    (ty.starts_with(|c: char| c.is_ascii_uppercase()) && ident(ty) && ident(item))
        .then_some((ty, item))
}

/// The workspace's Rust files (outside `target/`), and the names they define.
struct Tree {
    files: Vec<String>,
    types: std::collections::HashSet<String>,
    members: std::collections::HashSet<String>,
}

impl Tree {
    fn read(root: &Path) -> Tree {
        let mut tree = Tree {
            files: Vec::new(),
            types: Default::default(),
            members: Default::default(),
        };
        let mut dirs = vec![root.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                let name = e.file_name().to_string_lossy().to_string();
                if p.is_dir() {
                    if !name.starts_with('.') && name != "target" {
                        dirs.push(p);
                    }
                } else if name.ends_with(".rs") {
                    if let Ok(src) = fs::read_to_string(&p) {
                        tree.learn(&src);
                    }
                    let rel = p.strip_prefix(root).unwrap_or(&p);
                    tree.files.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        tree
    }

    /// Types (`struct`, `enum`, `trait`, `type`), and members: `fn`, `const`, `static`,
    /// fields (`name:` opening a line) and variants (a capitalized name opening a line,
    /// then `,`, `(` or `{`).
    fn learn(&mut self, src: &str) {
        for line in src.lines() {
            let mut ws = words(line).peekable();
            while let Some(w) = ws.next() {
                let next = ws.peek().map(|n| n.to_string());
                match (w, next) {
                    ("struct" | "enum" | "trait" | "type", Some(n)) => {
                        self.types.insert(n);
                    }
                    ("fn" | "const" | "static", Some(n)) => {
                        self.members.insert(n);
                    }
                    _ => {}
                }
            }
            let t = line.trim_start();
            let t = t
                .strip_prefix("pub(crate) ")
                .or_else(|| t.strip_prefix("pub(super) "))
                .or_else(|| t.strip_prefix("pub "))
                .unwrap_or(t);
            let name: String = t
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let rest = t[name.len()..].trim_start();
            let field = rest.starts_with(':') && !rest.starts_with("::");
            let variant = name.starts_with(|c: char| c.is_ascii_uppercase())
                && (rest.starts_with(',') || rest.starts_with('(') || rest.starts_with('{'));
            if !name.is_empty() && (field || variant) {
                self.members.insert(name);
            }
        }
    }

    fn has_file(&self, path: &str) -> Result<(), String> {
        let tail = format!("/{path}");
        if self.files.iter().any(|f| f == path || f.ends_with(&tail)) {
            Ok(())
        } else {
            Err("no such file in the workspace".into())
        }
    }

    fn has_member(&self, ty: &str, item: &str) -> Result<(), String> {
        if !self.types.contains(ty) || self.members.contains(item) {
            Ok(())
        } else {
            Err(format!(
                "`{ty}` is ours, and nothing of it is named `{item}`"
            ))
        }
    }
}

fn check(root: &Path, base: &str, path: &str, item: &str) -> Result<(), String> {
    let rel = if TOP.iter().any(|t| path.starts_with(t)) {
        path.to_string()
    } else {
        format!("{base}{path}")
    };
    let src = fs::read_to_string(root.join(&rel)).map_err(|_| format!("no file {rel}"))?;
    let mut parts: Vec<&str> = item.split("::").collect();
    let name = parts.pop().unwrap_or_default();
    if !defines(&src, name) {
        return Err(format!("no item `{name}` in {rel}"));
    }
    if let Some(ty) = parts.pop() {
        let has_type = src.lines().any(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            let l = l.strip_prefix("pub(super) ").unwrap_or(l);
            let l = l.strip_prefix("pub ").unwrap_or(l);
            (l.starts_with("impl") && words(l).any(|w| w == ty))
                || ["struct", "enum", "trait", "type"]
                    .iter()
                    .any(|k| l.starts_with(&format!("{k} {ty}")) && word_at(l, k.len() + 1, ty))
        });
        if !has_type {
            return Err(format!("no type or impl `{ty}` in {rel}"));
        }
    }
    Ok(())
}

/// Whether `src` has a line defining `name` as an item.
fn defines(src: &str, name: &str) -> bool {
    src.lines().any(|l| {
        let mut ws = words(l).peekable();
        while let Some(w) = ws.next() {
            if (ITEM_KINDS.contains(&w) || w == "macro_rules") && ws.peek() == Some(&name) {
                return true;
            }
        }
        false
    })
}

/// The identifiers of a line, in order.
fn words(l: &str) -> impl Iterator<Item = &str> {
    l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// Whether `ty` at byte `at` of `l` is a whole word.
fn word_at(l: &str, at: usize, ty: &str) -> bool {
    l[at..]
        .strip_prefix(ty)
        .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_spans_across_lines_and_skips_fences() {
        let text = "# Crate\n`a.rs: F::g` and `b.rs:\n  h`\n```\n`c.rs: x`\n```\n## The proxy\n`d.rs: y` `not one`\n";
        let got: Vec<_> = spans(text, false)
            .iter()
            .map(|(l, b, s)| format!("{l} {b} {s}"))
            .collect();
        assert_eq!(
            got,
            [
                "2 src/ a.rs: F::g",
                "2 src/ b.rs: h",
                "8 proxy/src/ d.rs: y",
                "8 proxy/src/ not one"
            ]
        );
        assert_eq!(citation("b.rs: h"), Some(("b.rs".into(), "h".into())));
        assert_eq!(citation("not one"), None);
        assert!(is_path("watch/stream.rs") && !is_path("a b.rs"));
        assert_eq!(member("Writer::flush()"), Some(("Writer", "flush")));
        assert_eq!(member("writer::flush"), None);
    }

    #[test]
    fn a_member_of_our_type_must_exist_and_others_are_not_checked() {
        let mut tree = Tree {
            files: vec!["src/watch/stream.rs".into()],
            types: Default::default(),
            members: Default::default(),
        };
        tree.learn("pub(crate) struct Writer {\n    pub(crate) burst: Vec<u8>,\n}\nenum Kind {\n    Created,\n    Events(u8),\n}\nimpl Writer {\n    fn flush(&mut self) {}\n}\n");
        for ok in ["flush", "burst", "Created", "Events"] {
            assert!(tree.has_member("Writer", ok).is_ok(), "{ok}");
        }
        assert!(tree.has_member("Writer", "apply").is_err());
        assert!(tree.has_member("Client", "connect").is_ok(), "not ours");
        assert!(tree.has_file("stream.rs").is_ok() && tree.has_file("watch/stream.rs").is_ok());
        assert!(tree.has_file("ream.rs").is_err() && tree.has_file("follower.rs").is_err());
    }

    #[test]
    fn an_item_is_a_definition_and_a_type_its_impl() {
        let src = "pub(crate) struct Writer;\nimpl Writer {\n    pub(super) fn flush(&mut self) {}\n}\nfn flushing() {}\n";
        assert!(defines(src, "flush"));
        assert!(!defines(src, "apply"));
        assert!(!defines(src, "flus"));
        let dir = std::env::temp_dir().join(format!("doc-refs-{}", std::process::id()));
        fs::create_dir_all(dir.join("src")).unwrap();
        fs::write(dir.join("src/w.rs"), src).unwrap();
        assert!(check(&dir, "src/", "w.rs", "Writer::flush").is_ok());
        assert!(check(&dir, "src/", "w.rs", "Reader::flush").is_err());
        assert!(check(&dir, "src/", "w.rs", "Writer::apply").is_err());
        assert!(check(&dir, "src/", "x.rs", "flush").is_err());
        let _ = fs::remove_dir_all(dir);
    }
}
