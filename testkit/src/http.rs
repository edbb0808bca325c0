//! etcd's HTTP gateway over a plain std `TcpStream`: `/health` and the member status, so
//! that the process harness needs no async runtime.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// What `/v3/maintenance/status` says about one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    /// This member's id.
    pub member_id: u64,
    /// The leader's member id (0 when there is none).
    pub leader: u64,
    /// The member's current store revision.
    pub revision: i64,
    /// The raft term.
    pub raft_term: u64,
    /// The server version, e.g. `3.4.23`.
    pub version: String,
}

/// Whether `GET /health` on `addr` answers `{"health":"true"}`.
pub fn is_healthy(addr: SocketAddr) -> bool {
    match http_request(addr, "GET", "/health", None, Duration::from_secs(2)) {
        Ok((200, body)) => body.replace(' ', "").contains(r#""health":"true""#),
        _ => false,
    }
}

/// How many calls of gRPC method `method` (`"Range"`, `"Watch"`, ...) etcd at `addr`
/// has started, from its `/metrics` (`grpc_server_started_total`); `None` if it cannot
/// be read.
pub fn grpc_started(addr: SocketAddr, method: &str) -> Option<u64> {
    let (code, body) = http_request(addr, "GET", "/metrics", None, Duration::from_secs(5)).ok()?;
    if code != 200 {
        return None;
    }
    let label = format!("grpc_method=\"{method}\"");
    let mut total = 0;
    for line in body.lines() {
        if line.starts_with("grpc_server_started_total{") && line.contains(&label) {
            total += line.rsplit(' ').next()?.parse::<f64>().ok()? as u64;
        }
    }
    Some(total)
}

/// `POST /v3/maintenance/status` on `addr` (etcd's grpc-gateway), parsed by hand.
pub fn member_status(addr: SocketAddr) -> Option<MemberStatus> {
    let (code, body) = http_request(
        addr,
        "POST",
        "/v3/maintenance/status",
        Some("{}"),
        Duration::from_secs(2),
    )
    .ok()?;
    if code != 200 {
        return None;
    }
    parse_member_status(&body)
}

/// A status response body, parsed by hand (etcd 3.4 writes 64-bit numbers as strings).
fn parse_member_status(body: &str) -> Option<MemberStatus> {
    // {"header":{"cluster_id":"..","member_id":"..","revision":"..","raft_term":".."},
    //  "version":"3.4.23",..,"leader":"..",..}
    let header_start = body.find(r#""header""#)?;
    let header_end = header_start + body[header_start..].find('}')?;
    let header = &body[header_start..header_end];
    let rest = format!("{}{}", &body[..header_start], &body[header_end..]);
    Some(MemberStatus {
        member_id: json_field(header, "member_id")
            .or_else(|| json_field(header, "memberId"))?
            .parse()
            .ok()?,
        leader: json_field(&rest, "leader")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        revision: json_field(header, "revision")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        raft_term: json_field(header, "raft_term")
            .or_else(|| json_field(header, "raftTerm"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        version: json_field(&rest, "version").unwrap_or_default(),
    })
}

/// The value of `"name": value` in a flat JSON text, without quotes (string or number).
fn json_field(json: &str, name: &str) -> Option<String> {
    let key = format!("\"{name}\"");
    let at = json.find(&key)? + key.len();
    let rest = json[at..].trim_start().strip_prefix(':')?.trim_start();
    if let Some(s) = rest.strip_prefix('"') {
        Some(s[..s.find('"')?].to_string())
    } else {
        let end = rest
            .find(|c: char| c == ',' || c == '}' || c.is_whitespace())
            .unwrap_or(rest.len());
        Some(rest[..end].to_string())
    }
}

/// A minimal HTTP/1.1 request over a std `TcpStream` (`Connection: close`), returning the status
/// code and the body (chunked transfer encoding is decoded).
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: etcd-test-harness\r\n\
         Accept: application/json\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, payload) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no HTTP header end"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad HTTP status line"))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked {
        dechunk(payload)
    } else {
        payload.to_string()
    };
    Ok((code, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_body_of_etcd_3_4() {
        let body = r#"{"header":{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","revision":"7","raft_term":"2"},"version":"3.4.23","dbSize":"20480","leader":"10276657743932975437","raftIndex":"8","raftTerm":"2","raftAppliedIndex":"8","dbSizeInUse":"20480"}"#;
        assert_eq!(
            parse_member_status(body),
            Some(MemberStatus {
                member_id: 10276657743932975437,
                leader: 10276657743932975437,
                revision: 7,
                raft_term: 2,
                version: "3.4.23".to_string(),
            })
        );
        assert_eq!(
            parse_member_status(r#"{"error":"etcdserver: no leader"}"#),
            None
        );
    }

    #[test]
    fn json_fields_quoted_and_bare() {
        let json = r#"{"health": "true", "n": 42,"last":7}"#;
        assert_eq!(json_field(json, "health").as_deref(), Some("true"));
        assert_eq!(json_field(json, "n").as_deref(), Some("42"));
        assert_eq!(json_field(json, "last").as_deref(), Some("7"));
        assert_eq!(json_field(json, "missing"), None);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk("4\r\n{\"he\r\nd;ext=1\r\nalth\":\"true\"}\r\n0\r\n\r\n"),
            r#"{"health":"true"}"#
        );
        assert_eq!(dechunk("zz\r\n"), "");
    }
}
