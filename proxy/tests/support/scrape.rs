//! Scraping a proxy's `--metrics-addr`: `GET /metrics` over plain HTTP, the samples
//! parsed, and waiting until they say something (gauges follow streams asynchronously).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long [`scrape_until`] waits for its condition.
const WAIT: Duration = Duration::from_secs(30);

/// `GET path` over a fresh TCP connection: status, headers (lower-cased names), body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, BTreeMap<String, String>, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

/// A scrape: every sample line as (name, labels) → value.
pub struct Scrape {
    /// The scraped text.
    pub text: String,
    samples: BTreeMap<(String, BTreeMap<String, String>), f64>,
}

impl Scrape {
    /// Parses an exposition text.
    pub fn parse(text: String) -> Scrape {
        let mut samples = BTreeMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let rest = rest.strip_suffix('}').expect("closed labels");
                    let labels = rest
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once("=\"").expect("label=\"value\"");
                            (k.to_string(), v.trim_end_matches('"').to_string())
                        })
                        .collect();
                    (name.to_string(), labels)
                }
                None => (series.to_string(), BTreeMap::new()),
            };
            samples.insert((name, labels), value);
        }
        Scrape { text, samples }
    }

    /// The value of the sample `name` with exactly these labels.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples.get(&(name.to_string(), labels)).copied()
    }

    /// Like [`Scrape::get`]; panics (with the scrape) when there is no such sample.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?} in:\n{}", self.text))
    }
}

/// `GET /metrics`, checked to be 200 with the exposition content type, parsed.
pub fn scrape(addr: SocketAddr) -> Scrape {
    let (status, headers, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        headers.get("content-type").map(String::as_str),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    Scrape::parse(body)
}

/// Scrapes until `ok` holds (gauges follow the streams asynchronously), or panics with
/// the last scrape after 30 s.
pub async fn scrape_until(addr: SocketAddr, what: &str, ok: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = tokio::task::spawn_blocking(move || scrape(addr))
            .await
            .unwrap();
        if ok(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not seen in:\n{}",
            s.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
