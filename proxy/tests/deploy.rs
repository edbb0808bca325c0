//! The deployment files (`deploy/`) and docs/OPERATING.md checked against the real
//! binary: every `--flag` they pass is one `etcd-cache-proxy --help` lists, the
//! Kubernetes manifests are YAML with the fields they need, every metric the Grafana
//! dashboard and the alert rules use is exported by a running proxy in front of a real
//! etcd, the systemd unit passes `systemd-analyze verify` (skipped, with the reason
//! printed, where that tool is missing), and with `ETCD_CACHE_CONTAINER_TEST=1` the
//! container image builds (deploy/container/build-offline.sh) and its binary runs.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use etcd_client::{GetOptions, WatchOptions};
use support::scrape::scrape_until;
use support::{client, free_port, start_etcd, start_proxy, EtcdOptions};

const WAIT: Duration = Duration::from_secs(10);

/// Metrics the dashboard or OPERATING.md may name although a proxy in this test does not
/// export them, each with why the test cannot make it appear. None today: every metric
/// they use is registered when the proxy starts, or appears after the calls below.
const NOT_EXPORTED_HERE: &[(&str, &str)] = &[];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn kubernetes_files() -> Vec<(String, String)> {
    let dir = repo().join("deploy/kubernetes");
    let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    files.sort();
    assert!(files.len() >= 6, "manifests: {files:?}");
    files
}

/// The long flags `etcd-cache-proxy --help` lists.
fn help_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_etcd-cache-proxy"))
        .arg("--help")
        .output()
        .expect("running etcd-cache-proxy --help");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let flags: BTreeSet<String> = text
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .flat_map(flags_in)
        .collect();
    assert!(flags.contains("--resolver-prefix"), "{text}");
    flags
}

/// Every `--name` in `text` (a `--name=value` counts as `--name`).
fn flags_in(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut flags = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        let end = text[start + 2..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .map_or(text.len(), |n| start + 2 + n);
        let name = &text[start..end];
        if matches!(
            before,
            None | Some(b' ' | b'"' | b'\'' | b'`' | b'[' | b'=')
        ) && name.len() > 2
            && name.as_bytes()[2].is_ascii_lowercase()
        {
            flags.push(name.to_string());
        }
        i = end.max(start + 2);
    }
    flags
}

/// Says why a check did not run, on stderr itself: libtest captures `println!` and
/// `eprintln!` of a passing test, and a skip must not look like a pass.
fn skip(reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {reason}");
}

/// Lines that are not `#` comments.
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().filter(|l| !l.trim_start().starts_with('#'))
}

#[test]
fn every_flag_in_the_deployment_files_is_one_the_binary_has() {
    let known = help_flags();
    // Where the proxy's flags are, per file: the Containerfile's CMD and ENTRYPOINT (its
    // RUN lines are cargo's), the unit's ExecStart, the EnvironmentFile, the manifests,
    // and the flags OPERATING.md names in backticks.
    let container = read("deploy/container/Containerfile");
    let unit = read("deploy/systemd/etcd-cache-proxy.service");
    let env = read("deploy/systemd/etcd-cache-proxy.env");
    let operating = read("docs/OPERATING.md");
    let mut sources: Vec<(String, Vec<String>)> = vec![
        (
            "deploy/container/Containerfile (CMD)".into(),
            code_lines(&container)
                .filter(|l| l.starts_with("CMD") || l.starts_with("ENTRYPOINT"))
                .flat_map(flags_in)
                .collect(),
        ),
        (
            "deploy/systemd/etcd-cache-proxy.service (ExecStart)".into(),
            code_lines(&unit)
                .filter(|l| l.starts_with("ExecStart="))
                .flat_map(flags_in)
                .collect(),
        ),
        (
            "deploy/systemd/etcd-cache-proxy.env".into(),
            code_lines(&env).flat_map(flags_in).collect(),
        ),
        (
            "docs/OPERATING.md".into(),
            operating
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|s| s.starts_with("--"))
                .flat_map(flags_in)
                .collect(),
        ),
    ];
    for (name, text) in kubernetes_files() {
        sources.push((
            format!("deploy/kubernetes/{name}"),
            code_lines(&text).flat_map(flags_in).collect(),
        ));
    }
    let mut unknown = Vec::new();
    for (source, flags) in &sources {
        println!("{source}: {}", flags.join(" "));
        for f in flags {
            if !known.contains(f) {
                unknown.push(format!("{source}: {f}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "flags etcd-cache-proxy --help does not list:\n{}",
        unknown.join("\n")
    );
    // Each place was read where its flags are (a wrong filter would check nothing).
    let count = |prefix: &str| -> usize {
        sources
            .iter()
            .filter(|(s, _)| s.starts_with(prefix))
            .map(|(_, f)| f.len())
            .sum()
    };
    assert!(count("deploy/container") >= 2);
    assert!(count("deploy/systemd/etcd-cache-proxy.service") >= 2);
    assert!(count("deploy/systemd/etcd-cache-proxy.env") >= 5);
    assert!(count("deploy/kubernetes") >= 10);
    assert!(count("docs/OPERATING.md") >= 20);
    // The password travels in a file, never on a command line.
    for (source, flags) in &sources[..3] {
        assert!(
            !flags.iter().any(|f| f == "--password"),
            "{source} passes --password"
        );
    }
    for (source, flags) in &sources[1..] {
        if source.starts_with("deploy/") && flags.iter().any(|f| f == "--user") {
            assert!(
                flags.iter().any(|f| f == "--password-file")
                    || sources[1].1.iter().any(|f| f == "--password-file"),
                "{source}: --user without --password-file"
            );
        }
    }
}

// ---- a minimal YAML reader: block mappings and sequences, plain, quoted and flow
// scalars; what the manifests use and no more (no YAML crate is in the tree).

#[derive(Debug)]
enum Yaml {
    Map(Vec<(String, Yaml)>),
    List(Vec<Yaml>),
    Scalar(String),
}

impl Yaml {
    /// The node at a dotted path (`spec.template.spec.containers.0.args`).
    fn at(&self, path: &str) -> Option<&Yaml> {
        path.split('.').try_fold(self, |node, step| match node {
            Yaml::Map(entries) => entries.iter().find(|(k, _)| k == step).map(|(_, v)| v),
            Yaml::List(items) => items.get(step.parse::<usize>().ok()?),
            Yaml::Scalar(_) => None,
        })
    }

    fn str(&self, path: &str) -> Option<&str> {
        match self.at(path)? {
            Yaml::Scalar(s) => Some(s),
            _ => None,
        }
    }
}

/// One line of a document: its indent and its text; a `- ` prefix becomes a line of
/// its own (`-`) followed by its content two columns further in.
struct Line {
    number: usize,
    indent: usize,
    text: String,
}

fn yaml_documents(text: &str) -> Result<Vec<Yaml>, String> {
    let mut docs = Vec::new();
    let mut lines: Vec<Line> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let number = i + 1;
        if raw.trim_end() == "---" {
            if !lines.is_empty() {
                docs.push(parse_document(&lines)?);
            }
            lines.clear();
            continue;
        }
        let body = raw.trim_start_matches(' ');
        if body.starts_with('\t') {
            return Err(format!("line {number}: a tab in the indentation"));
        }
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let mut indent = raw.len() - body.len();
        let mut rest = body.trim_end();
        while rest == "-" || rest.starts_with("- ") {
            lines.push(Line {
                number,
                indent,
                text: "-".into(),
            });
            rest = rest[1..].trim_start();
            indent += 2;
            if rest.is_empty() {
                break;
            }
        }
        if !rest.is_empty() {
            lines.push(Line {
                number,
                indent,
                text: rest.to_string(),
            });
        }
    }
    if !lines.is_empty() {
        docs.push(parse_document(&lines)?);
    }
    Ok(docs)
}

fn parse_document(lines: &[Line]) -> Result<Yaml, String> {
    let mut pos = 0;
    let node = parse_block(lines, &mut pos, lines[0].indent)?;
    match lines.get(pos) {
        Some(l) => Err(format!("line {}: unexpected indentation", l.number)),
        None => Ok(node),
    }
}

fn parse_block(lines: &[Line], pos: &mut usize, indent: usize) -> Result<Yaml, String> {
    if lines[*pos].text == "-" {
        let mut items = Vec::new();
        while let Some(l) = lines.get(*pos) {
            if l.indent != indent || l.text != "-" {
                break;
            }
            *pos += 1;
            match lines.get(*pos) {
                Some(next) if next.indent > indent => {
                    items.push(parse_block(lines, pos, next.indent)?);
                }
                _ => items.push(Yaml::Scalar(String::new())),
            }
        }
        return Ok(Yaml::List(items));
    }
    let first = &lines[*pos];
    let mapping = first.text.contains(": ") || first.text.ends_with(':');
    if !mapping || first.text.starts_with(['"', '\'', '[', '{']) {
        // A lone scalar (a list item's value).
        *pos += 1;
        return scalar(&first.text, first.number).map(Yaml::Scalar);
    }
    let mut entries: Vec<(String, Yaml)> = Vec::new();
    while let Some(l) = lines.get(*pos) {
        if l.indent < indent || (l.indent == indent && l.text == "-") {
            break;
        }
        if l.indent > indent {
            return Err(format!("line {}: unexpected indentation", l.number));
        }
        let (key, value) = match l.text.split_once(": ") {
            Some((k, v)) => (k, v.trim()),
            None => match l.text.strip_suffix(':') {
                Some(k) => (k, ""),
                None => return Err(format!("line {}: not `key: value`: {}", l.number, l.text)),
            },
        };
        if key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
        {
            return Err(format!(
                "line {}: a key YAML reads otherwise: {key:?}",
                l.number
            ));
        }
        if entries.iter().any(|(k, _)| k == key) {
            return Err(format!("line {}: duplicate key {key}", l.number));
        }
        *pos += 1;
        let node = if value.is_empty() || value.starts_with('#') {
            match lines.get(*pos) {
                Some(next) if next.indent > indent => parse_block(lines, pos, next.indent)?,
                Some(next) if next.indent == indent && next.text == "-" => {
                    parse_block(lines, pos, indent)?
                }
                _ => Yaml::Scalar(String::new()),
            }
        } else {
            Yaml::Scalar(scalar(value, l.number)?)
        };
        entries.push((key.to_string(), node));
    }
    Ok(Yaml::Map(entries))
}

/// A scalar's value: quotes closed, flow collections balanced (kept as text), no block
/// scalar, no second `key: value` on the line.
fn scalar(text: &str, number: usize) -> Result<String, String> {
    let err = |what: &str| Err(format!("line {number}: {what}: {text}"));
    let after = |rest: &str| rest.trim().is_empty() || rest.trim_start().starts_with('#');
    if let Some(body) = text.strip_prefix('"') {
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    return if after(&body[i + 1..]) {
                        Ok(body[..i].to_string())
                    } else {
                        err("text after a quoted scalar")
                    };
                }
                _ => escaped = false,
            }
        }
        return err("an unclosed quote");
    }
    if let Some(body) = text.strip_prefix('\'') {
        // `''` is a quote inside; a lone `'` closes.
        let mut chars = body.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c != '\'' {
                continue;
            }
            if chars.next_if(|&(_, n)| n == '\'').is_some() {
                continue;
            }
            return if after(&body[i + 1..]) {
                Ok(body[..i].replace("''", "'"))
            } else {
                err("text after a quoted scalar")
            };
        }
        return err("an unclosed quote");
    }
    if text.starts_with(['[', '{']) {
        let mut depth = 0i32;
        let mut quote = None;
        for (i, c) in text.char_indices() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '[' | '{') => depth += 1,
                (None, ']' | '}') => {
                    depth -= 1;
                    if depth == 0 {
                        return if after(&text[i + 1..]) {
                            Ok(text[..=i].to_string())
                        } else {
                            err("text after a flow collection")
                        };
                    }
                }
                _ => {}
            }
        }
        return err("an unbalanced flow collection");
    }
    if text.starts_with(['|', '>', '&', '*', '!', '%', '@', '`']) {
        return err("a YAML construct these manifests do not use");
    }
    let value = text.split(" #").next().unwrap().trim_end();
    if value.contains(": ") {
        return err("a second `key: value` on one line");
    }
    Ok(value.to_string())
}

#[test]
fn the_yaml_reader_refuses_what_is_not_yaml() {
    let ok = "a:\n  b: 1\n  c:\n    - x\n    - y: \"q # z\"\n      z: [1, 2]\nd: 'it''s'\n";
    let doc = &yaml_documents(ok).unwrap()[0];
    assert_eq!(doc.str("a.c.1.y"), Some("q # z"));
    assert_eq!(doc.str("a.c.1.z"), Some("[1, 2]"));
    assert_eq!(doc.str("d"), Some("it's"));
    assert_eq!(doc.str("a.c.0"), Some("x"));
    for bad in [
        "a:\n  b: 1\n   c: 2\n",
        "a: 1\na: 2\n",
        "a:\n\tb: 1\n",
        "a: \"open\n",
        "a: [1, 2\n",
        "a: b: c\n",
        "a: 1\n- b\n",
        "a: 1\n  b: 2\n",
    ] {
        assert!(yaml_documents(bad).is_err(), "read as YAML: {bad:?}");
    }
}

#[test]
fn the_manifests_are_yaml_with_the_fields_kubernetes_needs() {
    let mut kinds: BTreeMap<String, Yaml> = BTreeMap::new();
    let mut listed = Vec::new();
    for (name, text) in kubernetes_files() {
        let docs = yaml_documents(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!docs.is_empty(), "{name}: no document");
        for doc in docs {
            let kind = doc
                .str("kind")
                .unwrap_or_else(|| panic!("{name}: no kind"))
                .to_string();
            assert!(doc.str("apiVersion").is_some(), "{name}: no apiVersion");
            if kind == "Kustomization" {
                if let Some(Yaml::List(items)) = doc.at("resources") {
                    listed.extend(items.iter().filter_map(|i| match i {
                        Yaml::Scalar(s) => Some(s.clone()),
                        _ => None,
                    }));
                }
            } else {
                assert!(
                    doc.str("metadata.name").is_some(),
                    "{name}: no metadata.name"
                );
            }
            println!("{name}: {kind}");
            kinds.insert(kind, doc);
        }
    }
    // Every manifest is applied by `kubectl apply -k`.
    let mut files: Vec<String> = kubernetes_files()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n != "kustomization.yaml")
        .collect();
    files.sort();
    listed.sort();
    assert_eq!(listed, files, "kustomization.yaml's resources");

    let deployment = &kinds["Deployment"];
    assert_eq!(deployment.str("spec.replicas"), Some("3"));
    let c = deployment
        .at("spec.template.spec.containers.0")
        .expect("a container");
    assert_eq!(c.str("readinessProbe.grpc.port"), Some("23790"));
    assert_eq!(c.str("livenessProbe.httpGet.path"), Some("/metrics"));
    assert!(c.str("resources.requests.cpu").is_some());
    assert!(c.str("resources.requests.memory").is_some());
    let Some(Yaml::List(args)) = c.at("args") else {
        panic!("no args")
    };
    let args: Vec<&str> = args
        .iter()
        .filter_map(|a| match a {
            Yaml::Scalar(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    for flag in [
        "--resolver-prefix=",
        "--resolver-ttl=",
        "--advertise-client-url=",
        "--metrics-addr=",
        "--password-file=",
    ] {
        assert!(
            args.iter().any(|a| a.starts_with(flag)),
            "{flag} in {args:?}"
        );
    }
    assert_eq!(kinds["Service"].str("spec.clusterIP"), Some("None"));
    assert!(kinds["PodDisruptionBudget"]
        .str("spec.maxUnavailable")
        .is_some());
    assert!(kinds["Secret"].at("stringData.password").is_some());
    assert!(kinds["ConfigMap"].at("data.RESOLVER_PREFIX").is_some());
}

/// Every `etcd_cache_*` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("etcd_cache_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The `expr` of every panel target of the dashboard.
fn dashboard_queries() -> Vec<String> {
    let dash: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/etcd-cache-proxy.json")).expect("JSON");
    let mut exprs = Vec::new();
    let mut ids = BTreeSet::new();
    for panel in dash["panels"].as_array().expect("panels") {
        assert!(ids.insert(panel["id"].as_i64().expect("a panel id")));
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().expect("an expr").to_string());
        }
    }
    assert!(exprs.len() >= 20, "{exprs:?}");
    exprs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_use_is_exported() {
    let etcd = start_etcd(EtcdOptions::default()).await;
    let maddr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    // The flags of the Kubernetes manifest, on loopback.
    let proxy = start_proxy(
        etcd.endpoint(),
        [
            "--metrics-addr",
            &maddr.to_string(),
            "--prefix",
            "/registry/",
            "--advertise-client-url",
            "{addr}",
            "--resolver-prefix",
            "etcd-cache-proxies",
            "--resolver-ttl",
            "30",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    let mut c = client(&proxy.endpoint()).await;
    let mut w = c
        .watch("/registry/", Some(WatchOptions::new().with_prefix()))
        .await
        .unwrap();
    let created = tokio::time::timeout(WAIT, w.message())
        .await
        .expect("no created response in time")
        .unwrap()
        .unwrap();
    assert!(created.created());
    let rev = c
        .put("/registry/pods/a", "x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    loop {
        let r = tokio::time::timeout(WAIT, w.message())
            .await
            .expect("no event in time")
            .unwrap()
            .unwrap();
        if r.events()
            .iter()
            .any(|e| e.kv().unwrap().mod_revision() >= rev)
        {
            break;
        }
    }
    let got = c
        .get("/registry/", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(got.count(), 1);
    let scrape = scrape_until(maddr, "the proxy registered and a delivery counted", |s| {
        s.get("etcd_cache_proxy_registered", &[]) == Some(1.0)
            && s.get("etcd_cache_deliveries_total", &[("cache", "/registry/")]) >= Some(1.0)
            && s.get("etcd_cache_proxy_ranges_total", &[("served", "cache")]) >= Some(1.0)
    })
    .await;
    let exported: BTreeSet<String> = scrape
        .text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split(['{', ' '])
                .next()
                .expect("a sample name")
                .to_string()
        })
        .collect();

    let operating = read("docs/OPERATING.md");
    let alerts = operating
        .split("## What to alert on")
        .nth(1)
        .and_then(|s| s.split("```yaml").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("OPERATING.md: an alert rules block under `## What to alert on`");
    let rules = yaml_documents(alerts).expect("the alert rules are YAML");
    let Some(Yaml::List(rules)) = rules[0].at("groups.0.rules") else {
        panic!("no groups.0.rules in the alert rules")
    };
    assert!(rules.len() >= 8);
    let mut alert_exprs = Vec::new();
    for r in rules {
        assert!(r.str("alert").is_some(), "{r:?}");
        alert_exprs.push(r.str("expr").expect("an expr").to_string());
    }
    let mut used: Vec<(&str, BTreeSet<String>)> = vec![
        (
            "deploy/grafana/etcd-cache-proxy.json",
            metric_names(&dashboard_queries().join("\n")),
        ),
        (
            "docs/OPERATING.md (alert rules)",
            metric_names(&alert_exprs.join("\n")),
        ),
        ("docs/OPERATING.md (text)", metric_names(&operating)),
    ];
    let excused: BTreeMap<&str, &str> = NOT_EXPORTED_HERE.iter().copied().collect();
    let mut missing = Vec::new();
    for (source, names) in &mut used {
        assert!(names.len() >= 8, "{source}: {names:?}");
        for name in names.iter() {
            match excused.get(name.as_str()) {
                Some(why) => println!("{source}: {name} not checked: {why}"),
                None if exported.contains(name) => {}
                None => missing.push(format!("{source}: {name}")),
            }
        }
    }
    assert!(
        missing.is_empty(),
        "metrics not exported by a running proxy:\n{}\n--- scrape ---\n{}",
        missing.join("\n"),
        scrape.text
    );
    drop((w, c, proxy, etcd));
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let unit = read("deploy/systemd/etcd-cache-proxy.service");
    for line in [
        "DynamicUser=yes",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=\n",
        "EnvironmentFile=",
        "LoadCredential=password:",
        "--password-file %d/password",
    ] {
        assert!(unit.contains(line), "the unit has no {line:?}");
    }
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        skip("systemd-analyze is not installed (Debian: apt-get install systemd)");
        return;
    }
    // verify checks that ExecStart's program exists: the binary under test stands in
    // for /usr/local/bin/etcd-cache-proxy.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etcd-cache-proxy.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/local/bin/etcd-cache-proxy",
            env!("CARGO_BIN_EXE_etcd-cache-proxy"),
        ),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("running systemd-analyze verify");
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("systemd-analyze verify: {}\n{stderr}", out.status);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("etcd-cache-proxy.service"),
        "systemd-analyze verify warns about the unit:\n{stderr}"
    );

    // The exposure score OPERATING.md cites (`--offline` since systemd 250).
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&path)
        .output()
        .expect("running systemd-analyze security");
    let text = String::from_utf8_lossy(&out.stdout);
    let score = text
        .lines()
        .find_map(|l| l.split("etcd-cache-proxy.service: ").nth(1))
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse::<f64>().ok());
    match score {
        Some(score) => {
            println!("systemd-analyze security: exposure {score}");
            assert!(score <= 2.0, "exposure {score}:\n{text}");
        }
        None => skip(&format!(
            "systemd-analyze security --offline gave no score (systemd < 250?): {}",
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

#[test]
fn the_container_image_builds() {
    if std::env::var("ETCD_CACHE_CONTAINER_TEST").as_deref() != Ok("1") {
        skip(
            "set ETCD_CACHE_CONTAINER_TEST=1 to build the image with \
             deploy/container/build-offline.sh (needs root, buildah and mmdebstrap; a \
             release build of the proxy inside the builder)",
        );
        return;
    }
    let tag = "localhost/etcd-cache-proxy:deploy-test";
    let status = Command::new(repo().join("deploy/container/build-offline.sh"))
        .args(["--runtime", "scratch", "--tag", tag])
        .status()
        .expect("running deploy/container/build-offline.sh");
    assert!(status.success(), "the image build failed: {status}");

    let out = Command::new("buildah")
        .args(["inspect", "--type", "image", tag])
        .output()
        .expect("running buildah inspect");
    assert!(out.status.success());
    let image: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let config = &image["Docker"]["config"];
    assert_eq!(config["User"], "10001:10001", "{config}");
    for port in ["23790/tcp", "9379/tcp"] {
        assert!(config["ExposedPorts"].get(port).is_some(), "{config}");
    }
    assert!(
        config["Healthcheck"]["Test"]
            .to_string()
            .contains("/metrics"),
        "{config}"
    );

    // The binary runs inside the image: the loader and every library it links are there.
    let from = Command::new("buildah")
        .args(["from", tag])
        .output()
        .expect("running buildah from");
    assert!(from.status.success());
    let ctr = String::from_utf8(from.stdout).unwrap().trim().to_string();
    let run = Command::new("buildah")
        .args(["run", "--isolation", "chroot", &ctr, "--"])
        .args(["/usr/local/bin/etcd-cache-proxy", "--version"])
        .output()
        .expect("running buildah run");
    let _ = Command::new("buildah").args(["rm", &ctr]).status();
    let version = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && version.starts_with("etcd-cache-proxy "),
        "{version}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    println!("the image runs {}", version.trim());
}
