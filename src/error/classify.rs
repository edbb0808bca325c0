//! etcd-client's errors, classified: whether a call's connection failed or closed under
//! it, whether etcd's answer is permanent, a stream break, h2's own close, a refused
//! token or certificate, and the short text `Display` shows for a wrapped one. etcd's
//! error texts the cache matches live here too.

/// True for a call whose connection closed, reset or broke under it after the connect:
/// hyper's "connection closed", or a broken pipe, reset, abort or early EOF in the
/// status's sources. Not a connect error (tonic's "connect error").
pub(super) fn closed_under_call(status: &tonic::Status) -> bool {
    use std::io::ErrorKind;
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let text = e.to_string();
        if text.contains(CONNECT_ERROR) {
            return false;
        }
        if text.contains(CONNECTION_CLOSED) {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                ErrorKind::BrokenPipe
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::UnexpectedEof
            );
        }
        source = e.source();
    }
    false
}

/// True for a call that failed because its connection did: a refused or failed connect
/// (tonic's `Unavailable`), or a connection closed, reset or broken under the call (see
/// [`closed_under_call`]). A read failed so was never answered, and asking again on a new
/// connection is safe. Not a refusal over certificates, which retrying cannot change.
pub(crate) fn connection_failed(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(_) if too_many_data_frames(e) => true,
        etcd_client::Error::GRpcStatus(status) => {
            !certificate_refused(status)
                && (status.code() == tonic::Code::Unavailable || closed_under_call(status))
        }
        _ => false,
    }
}

/// See [`Error::is_permanent_upstream_failure`].
pub(super) fn permanent(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            // A token older than the auth store (JWT, after an auth change): the next
            // attempt authenticates again.
            let old_token = status.message().contains(AUTH_OLD_REVISION);
            (matches!(
                status.code(),
                Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::InvalidArgument
                    | Code::Unimplemented
            ) && !old_token)
                || certificate_refused(status)
        }
        etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => true,
        _ => false,
    }
}

/// The longest summary of a cause that `Display` shows; the rest is behind `source()`.
const SUMMARY_MAX: usize = 160;

/// `text`'s first line, cut at [`SUMMARY_MAX`] characters.
pub(super) fn shorten(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    match line.char_indices().nth(SUMMARY_MAX) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}

/// The deepest error under `e` (the one that says what really happened: `Connection
/// reset by peer (os error 104)`), else etcd's message or etcd-client's text.
pub(super) fn root_cause_text(e: &etcd_client::Error) -> String {
    let deepest = |first: Option<&(dyn std::error::Error + 'static)>| {
        let mut last = None;
        let mut next = first;
        while let Some(err) = next {
            last = Some(err.to_string());
            next = err.source();
        }
        last
    };
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            deepest(std::error::Error::source(s)).unwrap_or_else(|| s.message().to_string())
        }
        etcd_client::Error::TransportError(t) => {
            deepest(std::error::Error::source(t)).unwrap_or_else(|| t.to_string())
        }
        etcd_client::Error::IoError(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// One line for an etcd-client error: etcd's message and its status code, or what
/// failed under a transport error.
pub(super) fn upstream_summary(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            // A status made from a transport failure carries it as its source: its root
            // (`Connection refused (os error 111)`) says more than tonic's message.
            let root = std::error::Error::source(s)
                .map(|_| root_cause_text(e))
                .filter(|root| !s.message().contains(root.as_str()));
            match (s.message(), root) {
                ("", None) => format!("{:?}", s.code()),
                ("", Some(root)) => format!("{} ({:?})", shorten(&root), s.code()),
                (message, None) => format!("{} ({:?})", shorten(message), s.code()),
                (message, Some(root)) => {
                    format!("{}: {} ({:?})", shorten(message), shorten(&root), s.code())
                }
            }
        }
        etcd_client::Error::TransportError(_) => {
            format!("cannot connect: {}", shorten(&root_cause_text(e)))
        }
        etcd_client::Error::IoError(io) => format!("I/O failure: {}", shorten(&io.to_string())),
        other => shorten(&other.to_string()),
    }
}

/// Whether `e`, ending a watch stream, says that the stream broke under the cache (an
/// HTTP/2 protocol error, the connection reset, closed or canceled) rather than that
/// etcd answered: a transport or I/O error, or a status of code Unknown, Unavailable,
/// Cancelled or Internal whose message or causes read as the transport's. etcd's own
/// answers ("etcdserver: no leader", ...) stay what etcd said.
pub(super) fn is_stream_break(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    const BROKEN: &[&str] = &[
        "h2 protocol error",
        "connection reset",
        "broken pipe",
        "connection closed",
        "connection aborted",
        "error reading a body",
        "transport error",
        "operation was canceled",
        "unexpected end of file",
    ];
    let broken = |text: &str| {
        let text = text.to_ascii_lowercase();
        BROKEN.iter().any(|b| text.contains(b))
    };
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // Answered `ResourceExhausted` (tonic's code for `ENHANCE_YOUR_CALM`).
        etcd_client::Error::GRpcStatus(_) if too_many_data_frames(e) => true,
        etcd_client::Error::GRpcStatus(status) => {
            if !matches!(
                status.code(),
                Code::Unknown | Code::Unavailable | Code::Cancelled | Code::Internal
            ) {
                return false;
            }
            if broken(status.message()) {
                return true;
            }
            let mut source = std::error::Error::source(status);
            while let Some(err) = source {
                if broken(&err.to_string()) {
                    return true;
                }
                source = err.source();
            }
            false
        }
        _ => false,
    }
}

/// True for a call or stream whose connection the client's own h2 closed because too
/// many small DATA frames sat unread ([`TOO_MANY_DATA_FRAMES`] in its text or sources).
pub(crate) fn too_many_data_frames(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = e else {
        return false;
    };
    if status.message().contains(TOO_MANY_DATA_FRAMES) {
        return true;
    }
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.to_string().contains(TOO_MANY_DATA_FRAMES) {
            return true;
        }
        source = err.source();
    }
    false
}

/// tonic's text for a failed connect (refused, unreachable, reset while connecting).
const CONNECT_ERROR: &str = "connect error";
/// hyper's reason for a request canceled because its connection closed under it.
pub(super) const CONNECTION_CLOSED: &str = "connection closed";
/// The debug data of h2's GOAWAY `ENHANCE_YOUR_CALM` when too many small DATA frames sat
/// unread: the client's own HTTP/2 stack closed the connection (see
/// `upstream/channel.rs`), etcd did not.
const TOO_MANY_DATA_FRAMES: &str = "too_many_data_frames";

// etcd's status words, read here and nowhere else.

/// etcd's answer to a token that is invalid or expired (or lost: etcd keeps simple tokens
/// in memory only). etcd-client refreshes it only with `with_auto_token_refresh`, and not
/// at all when etcd 3.4 refuses a watch for it in a watch response.
pub(crate) const INVALID_AUTH_TOKEN: &str = "invalid auth token";
/// etcd's answer to a token older than its auth store: a JWT token carries the store's
/// revision, so any change to users, roles or permissions makes every such token old.
/// etcd-client never refreshes it (etcd's Go client does, as for an invalid token).
pub(crate) const AUTH_OLD_REVISION: &str = "revision of auth store is old";
/// etcd's cancel reason for a watch outside the user's permissions.
pub(crate) const PERMISSION_DENIED: &str = "permission denied";
/// etcd's `mvcc.ErrCompacted`, as its message ends: a read at a compacted revision.
pub(crate) const COMPACTED_REVISION: &str = "required revision has been compacted";
/// etcd's `mvcc.ErrFutureRev`: a read at a revision etcd has not reached.
pub(crate) const FUTURE_REVISION: &str = "required revision is a future revision";

/// Whether etcd refused a call for its token (see [`INVALID_AUTH_TOKEN`],
/// [`AUTH_OLD_REVISION`]): authenticating again and retrying can succeed.
pub(crate) fn token_refused(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.message().contains(INVALID_AUTH_TOKEN) || s.message().contains(AUTH_OLD_REVISION))
}

/// Whether a transport failure is a TLS handshake refused over certificates: rustls's
/// "invalid peer certificate: …" (the server's certificate does not verify against the
/// configured CA), or a fatal alert from the server (etcd refused the client's
/// certificate or its absence under `--client-cert-auth`). Read from the error chain's
/// text, which carries rustls's error through tonic and hyper.
fn certificate_refused(status: &tonic::Status) -> bool {
    let refused = |text: &str| {
        text.contains("invalid peer certificate") || text.contains("received fatal alert")
    };
    if refused(status.message()) {
        return true;
    }
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if refused(&e.to_string()) {
            return true;
        }
        source = e.source();
    }
    false
}
