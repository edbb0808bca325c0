//! `cargo xtask sizes`: the house's bounds on the size of the code a reader meets: no file
//! over [`MAX_FILE_LINES`] lines and no function over [`MAX_FN_LINES`] in `src/` and
//! `proxy/src/` (tests inside those trees included).
//!
//! A function runs from the line of its `fn` to the line of the brace that closes its
//! body, found by matching braces in the source with comments, string, raw string and
//! char literals blanked (their newlines kept). A declaration without a body (a trait's)
//! is not a function here. The command prints every file and function over its bound,
//! and the largest of each, and fails if one is over.

use std::fs;

/// The source trees checked, relative to the workspace root.
const TREES: &[&str] = &["src", "proxy/src"];
/// The longest file allowed, in lines.
pub(crate) const MAX_FILE_LINES: usize = 800;
/// The longest function allowed, in lines.
pub(crate) const MAX_FN_LINES: usize = 120;

pub(crate) fn command(args: &[String]) -> i32 {
    if !args.is_empty() {
        eprintln!("xtask sizes: no options");
        return 2;
    }
    let root = crate::root();
    let mut files = Vec::new();
    for tree in TREES {
        crate::cycles::collect(&root.join(tree), &mut files);
    }
    let mut over = 0;
    let mut largest_file = (0, String::new());
    let mut longest_fn = (0, String::new());
    for file in &files {
        let Ok(source) = fs::read_to_string(file) else {
            eprintln!("xtask sizes: cannot read {}", file.display());
            return 1;
        };
        let name = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        let lines = source.lines().count();
        if lines > largest_file.0 {
            largest_file = (lines, name.clone());
        }
        if lines > MAX_FILE_LINES {
            println!("{name}: {lines} lines (at most {MAX_FILE_LINES})");
            over += 1;
        }
        for f in functions(&source) {
            let at = format!("{name}:{} fn {}", f.line, f.name);
            if f.lines > longest_fn.0 {
                longest_fn = (f.lines, at.clone());
            }
            if f.lines > MAX_FN_LINES {
                println!("{at}: {} lines (at most {MAX_FN_LINES})", f.lines);
                over += 1;
            }
        }
    }
    println!(
        "{} files in {}: largest {} ({} lines), longest function {} ({} lines); {over} over the bounds",
        files.len(),
        TREES.join(", "),
        largest_file.1,
        largest_file.0,
        longest_fn.1,
        longest_fn.0,
    );
    i32::from(over > 0)
}

/// One function of a file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Function {
    pub(crate) name: String,
    /// The line of its `fn` (from 1).
    pub(crate) line: usize,
    /// From that line to the line of its closing brace, both counted.
    pub(crate) lines: usize,
}

/// Every function with a body in `source`, nested ones too.
pub(crate) fn functions(source: &str) -> Vec<Function> {
    let code = blank(source);
    let b = code.as_bytes();
    let line_at = |i: usize| code[..i].bytes().filter(|&c| c == b'\n').count() + 1;
    let is_word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(found) = code[i..].find("fn ") {
        let at = i + found;
        i = at + 3;
        if at > 0 && is_word(b[at - 1]) {
            continue;
        }
        let name_start = i;
        let mut j = i;
        while j < b.len() && is_word(b[j]) {
            j += 1;
        }
        if j == name_start {
            continue;
        }
        let name = code[name_start..j].to_string();
        // The body's opening brace, unless a `;` ends a declaration first.
        let Some(open) = code[j..].find(['{', ';']).map(|k| j + k) else {
            break;
        };
        if b[open] == b';' {
            continue;
        }
        let mut depth = 0usize;
        let mut end = None;
        for (k, &c) in b.iter().enumerate().skip(open) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            break;
        };
        let line = line_at(at);
        out.push(Function {
            name,
            line,
            lines: line_at(end) - line + 1,
        });
    }
    out
}

/// `source` with comments and string, raw string and char literals replaced by spaces,
/// newlines kept.
fn blank(source: &str) -> String {
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let keep_lines = |out: &mut Vec<u8>, part: &[u8]| {
        out.extend(part.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }));
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let len = if rest.starts_with(b"//") {
            rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            rest.windows(2)
                .skip(2)
                .position(|w| w == b"*/")
                .map_or(rest.len(), |p| p + 4)
        } else if let Some(len) = raw_string(rest, i > 0 && b[i - 1].is_ascii_alphanumeric()) {
            len
        } else if rest[0] == b'"' {
            let mut k = 1;
            while k < rest.len() && rest[k] != b'"' {
                k += if rest[k] == b'\\' { 2 } else { 1 };
            }
            (k + 1).min(rest.len())
        } else if rest[0] == b'\'' && rest.len() > 2 && (rest[2] == b'\'' || rest[1] == b'\\') {
            // A char literal ('a', '\n', '{'); a lifetime has no closing quote.
            let mut k = 1;
            while k < rest.len() && rest[k] != b'\'' {
                k += if rest[k] == b'\\' { 2 } else { 1 };
            }
            (k + 1).min(rest.len())
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        keep_lines(&mut out, &rest[..len]);
        i += len;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The length of a raw string literal (`r"..."`, `r#"..."#`, `br"..."`) at the start of
/// `rest`, if one starts there (`after_word`: the byte before is part of a word, so an
/// `r` there is not a literal's).
fn raw_string(rest: &[u8], after_word: bool) -> Option<usize> {
    if after_word {
        return None;
    }
    let start = if rest.starts_with(b"br") {
        2
    } else if rest.starts_with(b"r") {
        1
    } else {
        return None;
    };
    let hashes = rest[start..].iter().take_while(|&&c| c == b'#').count();
    if rest.get(start + hashes) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = start + hashes + 1;
    rest[body..]
        .windows(close.len())
        .position(|w| w == close.as_slice())
        .map(|p| body + p + close.len())
        .or(Some(rest.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn functions_end_at_their_closing_brace_whatever_the_literals_hold() {
        let source = r##"
trait T {
    fn declared(&self);
}
fn a() {
    let s = "}{ fn fake() {";
    let c = '{';
    // fn commented() {
    let r = r#"}"#;
    fn inner<'a>(x: &'a str) -> &'a str {
        x
    }
}
/* fn in_block() { */
fn b() {}
"##;
        let found = functions(source);
        assert_eq!(
            found,
            vec![
                Function {
                    name: "a".into(),
                    line: 5,
                    lines: 9
                },
                Function {
                    name: "inner".into(),
                    line: 10,
                    lines: 3
                },
                Function {
                    name: "b".into(),
                    line: 15,
                    lines: 1
                },
            ]
        );
    }
}
