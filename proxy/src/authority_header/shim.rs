//! The read side of one client connection as h2 sees it: the bytes from the client pass
//! through [`AuthorityFix::poll_read`], which follows the HTTP/2 frames and holds back
//! only what h2 could not use yet anyway (a frame header cut by the end of a read, a
//! header block whose last frame has not come), so that it can give h2 a header block
//! written anew when its `:authority` holds a scheme (`hpack.rs`).
//!
//! The common path costs no copy: a read goes straight into h2's buffer, and the walk
//! reads the frame headers there (9 bytes a frame; a DATA frame's payload is skipped by
//! its length, never looked at) and each HEADERS frame's block in place. Bytes are copied
//! only when a block is rewritten, when a frame header or header block spans two reads,
//! or when h2's buffer has less room than what is held.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

use super::hpack;

/// The client's connection preface, passed as it is.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const PREFACE_LEN: usize = PREFACE.len();
/// A frame header: length (24 bits), type, flags, stream id (RFC 9113 §4.1).
const HEAD: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The stream dependency and weight of a HEADERS frame with [`PRIORITY`].
const PRIORITY_LEN: usize = 5;
/// The largest payload of a frame written anew: HTTP/2's initial `SETTINGS_MAX_FRAME_SIZE`,
/// which every server accepts (h2 keeps it).
const MAX_FRAME: usize = 16_384;
/// The most bytes of one header block (its frames with their headers and padding) held
/// back to be rewritten: h2's header list limit (16 KiB, which tonic keeps) and the
/// headers of a few frames. A larger block passes unchanged, as it came; only a block of
/// long Huffman-coded strings of rare octets can be that large and still within h2's
/// limit, and such a block keeps an `:authority` with a scheme (h2 refuses it as before).
pub(crate) const MAX_HELD: usize = 20 * 1024;
/// A buffer that grew beyond this while holding a large block is freed once empty.
const KEEP_CAPACITY: usize = 4 * 1024;

/// The state of one connection's read side. Empty buffers until a block is held.
#[derive(Debug, Default)]
pub(crate) struct AuthorityFix {
    at: At,
    /// Bytes read from the client and not yet given to h2, from a frame boundary on.
    held: Vec<u8>,
    /// Bytes for h2 that did not fit in its buffer (walked in `held`); they go before
    /// `held`.
    out: Vec<u8>,
    /// How much of `out` h2 has taken.
    taken: usize,
}

/// Where the walk is in the client's byte stream.
#[derive(Debug, Clone, Copy)]
enum At {
    /// Inside the connection preface, this many bytes left.
    Preface(usize),
    /// At the start of a frame.
    Frame,
    /// Inside a frame that passes as it is, this many bytes left.
    Inside(usize),
    /// Not HTTP/2: the connection did not open with the preface (an HTTP/1.1 request for
    /// `/proxy/health` or `/metrics`, `http_front.rs`). Every byte passes as it is.
    Off,
}

impl Default for At {
    fn default() -> Self {
        At::Preface(PREFACE_LEN)
    }
}

/// What a walk over a run of bytes decided.
#[derive(Debug, PartialEq)]
enum Scan {
    /// All of them go to h2 as they are.
    Pass,
    /// Those before the offset go as they are; from it on they wait for more.
    Hold(usize),
    /// Those before `at` go as they are, then `frames` (no longer) instead of `at..end`;
    /// from `end` on they are still to be walked.
    Rewrite {
        at: usize,
        end: usize,
        frames: Vec<u8>,
    },
}

/// A frame header.
#[derive(Debug, Clone, Copy)]
struct Head {
    len: usize,
    kind: u8,
    flags: u8,
    /// As sent, reserved bit included.
    stream: [u8; 4],
}

impl Head {
    /// The header at the start of `b` (at least [`HEAD`] bytes).
    fn read(b: &[u8]) -> Head {
        Head {
            len: usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: [b[5], b[6], b[7], b[8]],
        }
    }

    fn write(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: [u8; 4]) {
        out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
        out.extend_from_slice(&stream);
    }

    fn stream_id(&self) -> u32 {
        u32::from_be_bytes(self.stream) & 0x7FFF_FFFF
    }
}

/// A header block at the start of a run of bytes.
enum Block<'a> {
    /// Its last frame has not come yet.
    Incomplete,
    /// Too large to hold, or broken (h2 refuses it): its first frame passes as it is.
    Pass,
    /// `end` bytes of frames; its fragments joined, and the HEADERS frame's priority.
    Complete {
        end: usize,
        fragment: Cow<'a, [u8]>,
        priority: Option<&'a [u8]>,
    },
}

impl AuthorityFix {
    /// Reads from `inner` into `buf` as [`AsyncRead::poll_read`] does, with every header
    /// block whose `:authority` holds a scheme written anew.
    pub(crate) fn poll_read<R: AsyncRead + ?Sized>(
        &mut self,
        mut inner: Pin<&mut R>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if self.taken < self.out.len() {
                let n = (self.out.len() - self.taken).min(buf.remaining());
                buf.put_slice(&self.out[self.taken..self.taken + n]);
                self.taken += n;
                if self.taken == self.out.len() {
                    self.taken = 0;
                    clear(&mut self.out);
                }
                return Poll::Ready(Ok(()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if self.held.len() >= buf.remaining() {
                // h2's buffer cannot take what is held and more: read into its room, and
                // walk in `held`.
                let start = buf.filled().len();
                let read = inner.as_mut().poll_read(cx, buf);
                if !matches!(read, Poll::Ready(Ok(()))) {
                    buf.set_filled(start);
                    return read;
                }
                if buf.filled().len() == start {
                    // The end: what is held goes as it is.
                    self.out = std::mem::take(&mut self.held);
                    continue;
                }
                let mut held = std::mem::take(&mut self.held);
                held.extend_from_slice(&buf.filled()[start..]);
                buf.set_filled(start);
                let mut from = 0;
                loop {
                    match self.scan(&held[from..]) {
                        Scan::Pass => {
                            self.out = held;
                            break;
                        }
                        Scan::Hold(cut) => {
                            self.out.extend_from_slice(&held[..from + cut]);
                            self.held.extend_from_slice(&held[from + cut..]);
                            break;
                        }
                        Scan::Rewrite { at, end, frames } => {
                            let new_end = from + at + frames.len();
                            held.splice(from + at..from + end, frames);
                            from = new_end;
                        }
                    }
                }
                continue;
            }
            // The common path: what is held (usually nothing), then the read, straight
            // into h2's buffer, walked there.
            let start = buf.filled().len();
            let held = self.held.len();
            buf.put_slice(&self.held);
            let read = inner.as_mut().poll_read(cx, buf);
            if !matches!(read, Poll::Ready(Ok(()))) {
                buf.set_filled(start);
                return read;
            }
            clear(&mut self.held);
            if buf.filled().len() == start + held {
                // The end: what is held goes as it is (h2 sees a frame cut short).
                return Poll::Ready(Ok(()));
            }
            let mut from = start;
            loop {
                match self.scan(&buf.filled()[from..]) {
                    Scan::Pass => break,
                    Scan::Hold(cut) => {
                        self.held.extend_from_slice(&buf.filled()[from + cut..]);
                        buf.set_filled(from + cut);
                        break;
                    }
                    Scan::Rewrite { at, end, frames } => {
                        // In place: the new frames are no longer than the old (`scan`).
                        let (at, end, len) = (from + at, from + end, buf.filled().len());
                        let filled = buf.filled_mut();
                        filled[at..at + frames.len()].copy_from_slice(&frames);
                        filled.copy_within(end..len, at + frames.len());
                        buf.set_filled(len - (end - at - frames.len()));
                        from = at + frames.len();
                    }
                }
            }
            if buf.filled().len() > start {
                return Poll::Ready(Ok(()));
            }
        }
    }

    /// Walks `data`, the bytes that follow those walked before.
    fn scan(&mut self, data: &[u8]) -> Scan {
        let mut i = 0;
        loop {
            match self.at {
                At::Off => return Scan::Pass,
                At::Preface(left) => {
                    let n = left.min(data.len() - i);
                    let seen = PREFACE_LEN - left;
                    if data[i..i + n] != PREFACE[seen..seen + n] {
                        self.at = At::Off;
                        return Scan::Pass;
                    }
                    i += n;
                    if n < left {
                        self.at = At::Preface(left - n);
                        return Scan::Pass;
                    }
                    self.at = At::Frame;
                }
                At::Inside(left) => {
                    let n = left.min(data.len() - i);
                    i += n;
                    if n < left {
                        self.at = At::Inside(left - n);
                        return Scan::Pass;
                    }
                    self.at = At::Frame;
                }
                At::Frame => {
                    let rest = &data[i..];
                    if rest.is_empty() {
                        return Scan::Pass;
                    }
                    if rest.len() < HEAD {
                        return Scan::Hold(i);
                    }
                    let head = Head::read(rest);
                    if head.kind != HEADERS {
                        // DATA, SETTINGS, a CONTINUATION of a block that passed, ...
                        i += HEAD;
                        self.at = At::Inside(head.len);
                        continue;
                    }
                    match block(rest) {
                        Block::Incomplete => return Scan::Hold(i),
                        Block::Pass => {
                            i += HEAD;
                            self.at = At::Inside(head.len);
                        }
                        Block::Complete {
                            end,
                            fragment,
                            priority,
                        } => {
                            // Never longer than the frames they replace (the value is
                            // shorter, the padding gone, the frames as large as h2 allows),
                            // checked all the same: the rewrite is made in place.
                            let rewritten = hpack::rewrite(&fragment)
                                .map(|new| frames(&head, priority, &new))
                                .filter(|f| f.len() <= end);
                            match rewritten {
                                None => i += end,
                                Some(frames) => {
                                    return Scan::Rewrite {
                                        at: i,
                                        end: i + end,
                                        frames,
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Empties `v`, freeing it when a large block made it large.
fn clear(v: &mut Vec<u8>) {
    if v.capacity() > KEEP_CAPACITY {
        *v = Vec::new();
    } else {
        v.clear();
    }
}

/// The header block whose HEADERS frame starts `rest`. Allocates only to join the
/// fragments of a block of several frames.
fn block(rest: &[u8]) -> Block<'_> {
    let first = Head::read(rest);
    let mut end = 0;
    let mut head = first;
    let mut count = 0;
    loop {
        let frame_end = end + HEAD + head.len;
        // (A frame over the frame size h2 allows passes, for h2 to refuse as before.)
        if frame_end > MAX_HELD || head.len > MAX_FRAME {
            return Block::Pass;
        }
        if rest.len() < frame_end {
            return Block::Incomplete;
        }
        end = frame_end;
        count += 1;
        if head.flags & END_HEADERS != 0 {
            break;
        }
        if rest.len() < end + HEAD {
            return Block::Incomplete;
        }
        head = Head::read(&rest[end..]);
        if head.kind != CONTINUATION || head.stream_id() != first.stream_id() {
            return Block::Pass;
        }
    }
    let first_end = HEAD + first.len;
    let Some((priority, first_fragment)) = headers_payload(first.flags, &rest[HEAD..first_end])
    else {
        return Block::Pass;
    };
    let fragment = if count == 1 {
        Cow::Borrowed(first_fragment)
    } else {
        let mut joined = first_fragment.to_vec();
        let mut at = first_end;
        while at < end {
            let len = Head::read(&rest[at..]).len;
            joined.extend_from_slice(&rest[at + HEAD..at + HEAD + len]);
            at += HEAD + len;
        }
        Cow::Owned(joined)
    };
    Block::Complete {
        end,
        fragment,
        priority,
    }
}

/// A HEADERS frame's priority fields and block fragment, without its padding; `None`
/// when its padding or priority does not fit in it (h2 refuses it).
fn headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<&[u8]>, &[u8])> {
    let mut p = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*p.first()?);
        p = &p[1..];
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let (fields, rest) = p.split_at_checked(PRIORITY_LEN)?;
        priority = Some(fields);
        p = rest;
    }
    let len = p.len().checked_sub(pad)?;
    Some((priority, &p[..len]))
}

/// The frames of a block written anew: a HEADERS frame with the first's flags (END_STREAM,
/// PRIORITY with its fields) and no padding, then CONTINUATION frames as needed, at most
/// [`MAX_FRAME`] each.
fn frames(first: &Head, priority: Option<&[u8]>, block: &[u8]) -> Vec<u8> {
    let priority = priority.unwrap_or_default();
    let flags = first.flags & !(PADDED | END_HEADERS);
    let mut out = Vec::with_capacity(HEAD + priority.len() + block.len());
    let (now, mut rest) = block.split_at(block.len().min(MAX_FRAME - priority.len()));
    let end = if rest.is_empty() { END_HEADERS } else { 0 };
    Head::write(
        &mut out,
        priority.len() + now.len(),
        HEADERS,
        flags | end,
        first.stream,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(now);
    while !rest.is_empty() {
        let (now, later) = rest.split_at(rest.len().min(MAX_FRAME));
        let end = if later.is_empty() { END_HEADERS } else { 0 };
        Head::write(&mut out, now.len(), CONTINUATION, end, first.stream);
        out.extend_from_slice(now);
        rest = later;
    }
    out
}
