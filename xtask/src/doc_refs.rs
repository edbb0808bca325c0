//! `cargo xtask doc-refs`: every place the docs cite as `` `file.rs: Item` `` or
//! `` `file.rs: Type::item` `` exists: the file, an item of that name in it (`fn`,
//! `const`, `static`, `struct`, `enum`, `trait`, `type`, `mod`, `macro_rules!`), and for
//! `Type::item` the type defined or implemented there. The walks in docs/ARCHITECTURE.md
//! are written that way; a rename that leaves them behind fails the lints.
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
    let (mut cited, mut missing) = (0, Vec::new());
    for doc in &docs {
        let Ok(text) = fs::read_to_string(doc) else {
            continue;
        };
        let name = doc.strip_prefix(&root).unwrap_or(doc).display().to_string();
        for (line, base, path, item) in citations(&text, name.ends_with("PROXY.md")) {
            cited += 1;
            if let Err(why) = check(&root, base, &path, &item) {
                missing.push(format!("{name}:{line}: `{path}: {item}`: {why}"));
            }
        }
    }
    if missing.is_empty() {
        eprintln!(
            "xtask doc-refs: {cited} citations of `file.rs: item` in {} documents, each found",
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

/// Each `` `path.rs: Item` `` outside fenced code: (line, base folder, path, item).
fn citations(text: &str, proxy_doc: bool) -> Vec<(usize, &'static str, String, String)> {
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
                        if let Some((path, item)) = citation(&span) {
                            out.push((at + 1, base, path, item));
                        }
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

/// `path.rs: Item` or `path.rs: Type::item`, whitespace collapsed.
fn citation(span: &str) -> Option<(String, String)> {
    let span = span.split_whitespace().collect::<Vec<_>>().join(" ");
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
    fn finds_citations_across_lines_and_skips_fences() {
        let text = "# Crate\n`a.rs: F::g` and `b.rs:\n  h`\n```\n`c.rs: x`\n```\n## The proxy\n`d.rs: y` `not one`\n";
        let got = citations(text, false);
        let got: Vec<_> = got
            .iter()
            .map(|(l, b, p, i)| format!("{l} {b}{p} {i}"))
            .collect();
        assert_eq!(
            got,
            ["2 src/a.rs F::g", "2 src/b.rs h", "8 proxy/src/d.rs y"]
        );
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
