//! `cargo xtask cycles`: import circles among the files of `src/` and `proxy/src/`.
//!
//! Every path counts, not only `use` lines: `crate::a::b`, `super::x`, `self::y` and a
//! child module's own name (`apply::Writer` in `follower/mod.rs`), inline paths and
//! brace groups (`crate::{a, b::c}`) included. A path names the file of the longest
//! module prefix that exists. Comments, string literals and a file's trailing
//! `#[cfg(test)] mod tests` are left out (a test module may use its parent freely). A
//! circle is a strongly connected set of two or more files; the same graph is read again
//! between top-level entries (a file beside `lib.rs`/`main.rs`, or a whole folder), where
//! a circle is two parts of the tree that each use the other. The command prints each
//! circle and fails if there is any of either kind.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The source trees checked, relative to the workspace root.
const TREES: &[&str] = &["src", "proxy/src"];

pub(crate) fn command(args: &[String]) -> i32 {
    if !args.is_empty() {
        eprintln!("xtask cycles: no options");
        return 2;
    }
    let mut total = 0;
    for tree in TREES {
        let root = crate::root().join(tree);
        let (circles, folders) = circles(&root);
        for circle in &circles {
            println!("{tree}: circle of {}: {}", circle.len(), circle.join(" "));
        }
        for circle in &folders {
            println!(
                "{tree}: folder-level circle of {}: {}",
                circle.len(),
                circle.join(" ")
            );
        }
        println!(
            "{tree}: {} import circles between files, {} between top-level files and folders",
            circles.len(),
            folders.len()
        );
        total += circles.len() + folders.len();
    }
    i32::from(total > 0)
}

/// The circles among the `.rs` files under `root`, and among its top-level entries (a
/// file or a folder each), each as its members (relative, sorted).
pub(crate) fn circles(root: &Path) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
    let mut files = Vec::new();
    collect(root, &mut files);
    let modules: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (module_of(root, f), i))
        .collect();
    let sources: Vec<String> = files
        .iter()
        .map(|f| strip(&fs::read_to_string(f).unwrap_or_default()))
        .collect();
    let tree = Tree {
        mods: files.iter().map(|f| module_of(root, f)).collect(),
        exports: sources.iter().map(|s| exports(s)).collect(),
        modules,
    };
    let edges: Vec<BTreeSet<usize>> = sources
        .iter()
        .enumerate()
        .map(|(i, source)| {
            let mut to = BTreeSet::new();
            for path in paths(source) {
                if let Some(t) = tree.resolve(&tree.mods[i], &path, 0) {
                    if t != i {
                        to.insert(t);
                    }
                }
            }
            to
        })
        .collect();
    let file_circles = named_circles(&edges, |i| {
        let rel = files[i].strip_prefix(root).unwrap_or(&files[i]);
        rel.display().to_string()
    });
    // The same graph between top-level entries: a file beside `lib.rs`/`main.rs` is one
    // node, a folder (everything under it) another.
    let tops: Vec<String> = tree
        .mods
        .iter()
        .zip(&files)
        .map(|(m, f)| match m.first() {
            None => "(root)".to_string(),
            Some(first)
                if f.strip_prefix(root)
                    .is_ok_and(|r| r.components().count() > 1) =>
            {
                format!("{first}/")
            }
            Some(first) => format!("{first}.rs"),
        })
        .collect();
    let names: Vec<String> = tops
        .iter()
        .cloned()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let index = |t: &String| names.binary_search(t).expect("listed");
    let mut top_edges = vec![BTreeSet::new(); names.len()];
    for (i, to) in edges.iter().enumerate() {
        for &t in to {
            let (a, b) = (index(&tops[i]), index(&tops[t]));
            if a != b && tops[i] != "(root)" && tops[t] != "(root)" {
                top_edges[a].insert(b);
            }
        }
    }
    let folder_circles = named_circles(&top_edges, |i| names[i].clone());
    (file_circles, folder_circles)
}

/// The strongly connected sets of two or more nodes, each named and sorted.
fn named_circles(edges: &[BTreeSet<usize>], name: impl Fn(usize) -> String) -> Vec<Vec<String>> {
    strongly_connected(edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(|&i| name(i)).collect();
            names.sort();
            names
        })
        .collect()
}

/// Every `.rs` file under `dir`, recursively, in sorted order, into `out`.
pub(crate) fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/watch/stream.rs` → `[watch, stream]`; `mod.rs`, `lib.rs`, `main.rs` name their
/// folder.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The source without comments, string and char literals, and without a trailing
/// `#[cfg(test)] mod tests`.
fn strip(source: &str) -> String {
    let source = match source.find("#[cfg(test)]\nmod tests") {
        Some(i) => &source[..i],
        None => source,
    };
    let b = source.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('a', '\n'); a lifetime has no closing quote.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Every path of two or more segments, brace groups expanded one level
/// (`crate::a::{b, c::d}` gives `crate::a::b` and `crate::a::c`).
fn paths(source: &str) -> Vec<Vec<String>> {
    let b = source.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !ident(b[i]) || (i > 0 && (ident(b[i - 1]) || b[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let start = j;
            while j < b.len() && ident(b[j]) {
                j += 1;
            }
            segs.push(source[start..j].to_string());
            if b[j..].starts_with(b"::") && j + 2 < b.len() && ident(b[j + 2]) {
                j += 2;
            } else {
                break;
            }
        }
        if b[j..].starts_with(b"::{") {
            let close = source[j..].find('}').map_or(b.len(), |k| j + k);
            for item in source[j + 3..close].split(',') {
                let first: String = item
                    .trim()
                    .bytes()
                    .take_while(|&c| ident(c))
                    .map(char::from)
                    .collect();
                if !first.is_empty() {
                    let mut p = segs.clone();
                    p.push(first);
                    out.push(p);
                }
            }
            j = close;
        }
        if segs.len() > 1 {
            out.push(segs);
        }
        i = j.max(i + 1);
    }
    out
}

/// The files, their modules and what each re-exports.
struct Tree {
    mods: Vec<Vec<String>>,
    /// Per file: a re-exported name and the path it re-exports (`pub use a::B;`).
    exports: Vec<BTreeMap<String, Vec<String>>>,
    modules: BTreeMap<Vec<String>, usize>,
}

impl Tree {
    /// The file a path from module `me` names, if it is one of ours: the file of its
    /// longest module prefix, or, where the next segment is a name that module
    /// re-exports, the file it comes from.
    fn resolve(&self, me: &[String], path: &[String], depth: usize) -> Option<usize> {
        let full: Vec<String> = match path[0].as_str() {
            "crate" => path[1..].to_vec(),
            "self" => me.iter().chain(&path[1..]).cloned().collect(),
            "super" => {
                let ups = path.iter().take_while(|s| *s == "super").count();
                let keep = me.len().checked_sub(ups)?;
                me[..keep].iter().chain(&path[ups..]).cloned().collect()
            }
            child => {
                // A child module named by its own name from its parent.
                let mut m = me.to_vec();
                m.push(child.to_string());
                if !self.modules.contains_key(&m) {
                    return None;
                }
                me.iter().chain(path).cloned().collect()
            }
        };
        let n = (0..=full.len())
            .rev()
            .find(|&n| self.modules.contains_key(&full[..n]))?;
        let file = self.modules[&full[..n]];
        if depth < 8 {
            if let Some(source) = full.get(n).and_then(|name| self.exports[file].get(name)) {
                if let Some(t) = self.resolve(&self.mods[file], source, depth + 1) {
                    return Some(t);
                }
            }
        }
        Some(file)
    }
}

/// A file's re-exports: `pub use a::b::C;`, `pub(crate) use a::{B, C};`.
fn exports(source: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for line in source.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("pub") else {
            continue;
        };
        let rest = match rest.find("use ") {
            Some(k) if rest[..k].trim().is_empty() || rest.trim_start().starts_with('(') => {
                &rest[k + 4..]
            }
            _ => continue,
        };
        for path in paths(rest.trim_end_matches(';')) {
            if let Some(name) = path.last() {
                out.insert(name.clone(), path.clone());
            }
        }
    }
    out
}

/// Tarjan's strongly connected components.
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let n = edges.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_take_inline_paths_and_brace_groups() {
        let got = paths(&strip(
            "use crate::{a, b::c};\nfn f() { super::x::y(); apply::W::new(); // crate::z\n}",
        ));
        let got: Vec<String> = got.iter().map(|p| p.join("::")).collect();
        assert!(got.contains(&"crate::a".to_string()), "{got:?}");
        assert!(got.contains(&"crate::b".to_string()), "{got:?}");
        assert!(got.contains(&"super::x::y".to_string()), "{got:?}");
        assert!(got.contains(&"apply::W::new".to_string()), "{got:?}");
        assert!(
            !got.iter().any(|p| p.contains('z')),
            "comments are left out: {got:?}"
        );
    }

    /// The circles of a tree made of `files` (path, source) in a temporary folder.
    fn circles_of(name: &str, files: &[(&str, &str)]) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
        let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        for (path, source) in files {
            let path = dir.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, source).unwrap();
        }
        let found = circles(&dir);
        fs::remove_dir_all(&dir).unwrap();
        found
    }

    #[test]
    fn a_circle_through_an_inline_path_is_found() {
        let (found, _) = circles_of(
            "cycles",
            &[
                ("lib.rs", "mod a; mod w;"),
                ("a.rs", "fn f() -> bool { crate::w::s::OK }"),
                ("w/mod.rs", "mod s;"),
                ("w/s.rs", "use super::super::a;\npub const OK: bool = true;"),
            ],
        );
        assert_eq!(found, vec![vec!["a.rs".to_string(), "w/s.rs".to_string()]]);
    }

    /// `a.rs` uses one file of `w/` and another file of `w/` uses `a.rs`: no circle
    /// between files, one between `a.rs` and the folder.
    #[test]
    fn a_circle_between_a_file_and_a_folder_is_found() {
        let (files, folders) = circles_of(
            "folders",
            &[
                ("lib.rs", "mod a; mod w;"),
                ("a.rs", "use crate::w::x::X;"),
                ("w/mod.rs", "mod x; mod y;"),
                ("w/x.rs", "pub struct X;"),
                ("w/y.rs", "use crate::a;"),
            ],
        );
        assert!(files.is_empty(), "{files:?}");
        assert_eq!(folders, vec![vec!["a.rs".to_string(), "w/".to_string()]]);
    }
}
