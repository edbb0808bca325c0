//! The decisions kept: etcd's verdict per (token, key range), bounded in bytes, the least
//! recently used token's going first; with how a decision covers a range and how long a
//! JWT's lasts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use lru::LruCache;
use tokio::time::Instant;
use tonic::{Code, Status};

/// Decisions kept per token at most (the oldest goes first).
pub(super) const MAX_RANGES_PER_TOKEN: usize = 64;
/// Bytes counted for a decision beyond its key, range end and message (the entry, its
/// place in the token's list and the token's entry, rounded up).
pub(super) const DECISION_OVERHEAD: usize = 128;

/// etcd's answer to a caller, as kept.
#[derive(Clone, Debug)]
pub(super) enum Verdict {
    Allow,
    Deny(Code, String),
}

impl Verdict {
    pub(super) fn result(&self) -> Result<(), Status> {
        match self {
            Verdict::Allow => Ok(()),
            Verdict::Deny(code, msg) => Err(Status::new(*code, msg.clone())),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            Verdict::Allow => 0,
            Verdict::Deny(_, msg) => msg.len(),
        }
    }
}

#[derive(Debug)]
pub(super) struct Decision {
    pub(super) key: Bytes,
    pub(super) end: Bytes,
    pub(super) verdict: Verdict,
    /// When it is no longer used (the token's TTL or `exp`).
    pub(super) until: Instant,
}

impl Decision {
    pub(super) fn bytes(&self) -> usize {
        self.key.len() + self.end.len() + self.verdict.bytes() + DECISION_OVERHEAD
    }
}

/// One token's decisions.
#[derive(Debug)]
pub(super) struct TokenDecisions {
    list: Vec<Decision>,
    /// The bytes of `list` and of the token.
    bytes: usize,
    /// When one of them was last used or kept.
    used: Instant,
}

/// Every token's decisions, bounded in bytes; the least recently used token goes first.
pub(super) struct Decisions {
    by_token: LruCache<Bytes, TokenDecisions>,
    bytes: usize,
    limit: usize,
}

impl Decisions {
    pub(super) fn new(limit: usize) -> Decisions {
        Decisions {
            by_token: LruCache::unbounded(),
            bytes: 0,
            limit,
        }
    }

    pub(super) fn clear(&mut self) {
        self.by_token.clear();
        self.bytes = 0;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_token.is_empty()
    }

    /// Drops the decisions of tokens not used for `idle` (the least recently used go
    /// first, so this stops at the first token used since).
    pub(super) fn prune_unused(&mut self, now: Instant, idle: Duration) {
        while let Some((_, d)) = self.by_token.peek_lru() {
            if now.saturating_duration_since(d.used) < idle {
                break;
            }
            if let Some((_, gone)) = self.by_token.pop_lru() {
                self.bytes -= gone.bytes;
            }
        }
    }

    /// A kept decision for `[key, end)` still in force at `now` (marks the token used).
    pub(super) fn find(
        &mut self,
        token: &Bytes,
        key: &[u8],
        end: &[u8],
        now: Instant,
    ) -> Option<Verdict> {
        let entry = self.by_token.get_mut(token)?;
        entry.used = now;
        entry
            .list
            .iter()
            .filter(|d| now < d.until)
            .find_map(|d| match &d.verdict {
                Verdict::Allow if covers(&d.key, &d.end, key, end) => Some(Verdict::Allow),
                Verdict::Deny(..) if d.key == key && d.end == end => Some(d.verdict.clone()),
                _ => None,
            })
    }

    pub(super) fn insert(&mut self, token: &Bytes, d: Decision) {
        let cost = d.bytes();
        if cost + token.len() > self.limit {
            return;
        }
        if !self.by_token.contains(token) {
            self.by_token.put(
                token.clone(),
                TokenDecisions {
                    list: Vec::new(),
                    bytes: token.len(),
                    used: Instant::now(),
                },
            );
            self.bytes += token.len();
        }
        let entry = self.by_token.get_mut(token).expect("just inserted");
        entry.used = Instant::now();
        let before = entry.bytes;
        entry.list.retain(|o| !(o.key == d.key && o.end == d.end));
        if entry.list.len() >= MAX_RANGES_PER_TOKEN {
            entry.list.remove(0);
        }
        entry.list.push(d);
        entry.bytes = token.len() + entry.list.iter().map(Decision::bytes).sum::<usize>();
        self.bytes = self.bytes - before + entry.bytes;
        while self.bytes > self.limit {
            match self.by_token.pop_lru() {
                Some((_, gone)) => self.bytes -= gone.bytes,
                None => break,
            }
        }
    }
}

/// The `exp` claim of a JWT (`header.payload.signature`, the payload base64url JSON), if
/// `token` is one that has it. etcd's simple tokens (`random.index`) are not.
pub(super) fn jwt_expiry(token: &[u8]) -> Option<SystemTime> {
    use base64::Engine;
    let mut parts = token.split(|b| *b == b'.');
    let (_, payload, _, none) = (parts.next()?, parts.next()?, parts.next()?, parts.next());
    if none.is_some() {
        return None;
    }
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&json).ok()?;
    let exp = claims.get("exp")?.as_f64()?;
    (exp >= 0.0).then(|| UNIX_EPOCH + Duration::from_secs_f64(exp.min(1e12)))
}

/// Whether the range `[key, end)` (etcd's forms: empty end one key, `"\0"` from key on)
/// lies inside the range `[start, stop)` of the same forms.
pub(super) fn covers(start: &[u8], stop: &[u8], key: &[u8], end: &[u8]) -> bool {
    if key < start {
        return false;
    }
    // The allowed range's exclusive end; `None`: no bound.
    let one_key;
    let bound: Option<&[u8]> = match stop {
        b"\0" => None,
        b"" => {
            one_key = [start, b"\0"].concat();
            Some(&one_key)
        }
        s => Some(s),
    };
    match (end, bound) {
        (_, None) => true,
        (b"", Some(b)) => key < b,
        (b"\0", Some(_)) => false,
        (e, Some(b)) => e <= b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(key: &[u8], until: Instant) -> Decision {
        Decision {
            key: Bytes::copy_from_slice(key),
            end: Bytes::new(),
            verdict: Verdict::Deny(Code::Unauthenticated, "invalid auth token".into()),
            until,
        }
    }

    /// Distinct tokens with long keys: the decisions never hold more than their bound,
    /// the least recently used token goes first, and one decision above the bound is not
    /// kept at all.
    #[test]
    fn decisions_are_bounded_in_bytes_and_the_least_recently_used_token_goes() {
        let limit = 1 << 20;
        let mut d = Decisions::new(limit);
        let later = Instant::now() + Duration::from_secs(60);
        let key = vec![b'k'; 100 << 10];
        for i in 0..100u32 {
            let token = Bytes::from(format!("+garbage{i}"));
            d.insert(&token, decision(&key, later));
            assert!(d.bytes <= limit, "{} bytes after {i}", d.bytes);
            // The first token stays in use: it is never the least recently used.
            let first = Bytes::from_static(b"+garbage0");
            assert!(d.find(&first, &key, b"", Instant::now()).is_some(), "{i}");
        }
        assert!(d.by_token.len() < 12, "{}", d.by_token.len());
        assert!(d
            .find(&Bytes::from_static(b"+garbage1"), &key, b"", Instant::now())
            .is_none());
        let huge = vec![b'k'; 2 << 20];
        d.insert(&Bytes::from_static(b"+huge"), decision(&huge, later));
        assert!(d.bytes <= limit);
        assert!(!d.by_token.contains(&Bytes::from_static(b"+huge")));
    }

    /// A decision is used until its `until`, not after.
    #[test]
    fn a_decision_is_not_used_past_its_end() {
        let mut d = Decisions::new(1 << 20);
        let now = Instant::now();
        let token = Bytes::from_static(b"+t");
        d.insert(&token, decision(b"/a", now + Duration::from_secs(1)));
        assert!(d.find(&token, b"/a", b"", now).is_some());
        assert!(d
            .find(&token, b"/a", b"", now + Duration::from_secs(1))
            .is_none());
    }

    /// A JWT's `exp`; a simple token (`random.index`) and garbage have none.
    #[test]
    fn a_jwts_expiry_is_read_from_its_payload() {
        use base64::Engine;
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let jwt = format!(
            "{}.{}.sig",
            enc(r#"{"alg":"ES256"}"#),
            enc(r#"{"username":"reader","revision":5,"exp":1900000000}"#)
        );
        assert_eq!(
            jwt_expiry(jwt.as_bytes()),
            Some(UNIX_EPOCH + Duration::from_secs(1_900_000_000))
        );
        assert_eq!(jwt_expiry(b"QWERTYuiop.42"), None);
        assert_eq!(jwt_expiry(b"a.b.c"), None);
        assert_eq!(jwt_expiry(b"a.b.c.d"), None);
    }

    #[test]
    fn an_allowed_range_covers_its_sub_ranges() {
        // One key covers itself only.
        assert!(covers(b"/a/x", b"", b"/a/x", b""));
        assert!(!covers(b"/a/x", b"", b"/a/y", b""));
        assert!(!covers(b"/a/x", b"", b"/a/x", b"/a/y"));
        assert!(covers(b"/a/x", b"", b"/a/x", b"/a/x\0"));
        // A prefix covers its keys and sub-prefixes, not beyond.
        assert!(covers(b"/a/", b"/a0", b"/a/x", b""));
        assert!(covers(b"/a/", b"/a0", b"/a/b/", b"/a/b0"));
        assert!(covers(b"/a/", b"/a0", b"/a/", b"/a0"));
        assert!(!covers(b"/a/", b"/a0", b"/a/", b"/b"));
        assert!(!covers(b"/a/", b"/a0", b"/a/", b"\0"));
        assert!(!covers(b"/a/", b"/a0", b"/", b"/a0"));
        // From a key on covers everything after it.
        assert!(covers(b"/a/", b"\0", b"/z", b"\0"));
        assert!(covers(b"/a/", b"\0", b"/z", b""));
        assert!(!covers(b"/a/", b"\0", b"/", b""));
    }
}
