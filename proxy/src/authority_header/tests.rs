//! Header blocks from a reference encoder (every HPACK representation, Huffman or raw
//! strings, its own dynamic table with evictions and size updates), framed with
//! CONTINUATION splits, padding and priority, read through [`AuthorityFix`] in random
//! chunks into buffers of random sizes, and decoded by an independent HPACK decoder
//! (`loona-hpack`, with its own dynamic table): the header lists are the client's, but
//! for each `:authority` with a scheme, cut to its host and port.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use proptest::prelude::*;
use tokio::io::{AsyncRead, ReadBuf};

use super::hpack::{host_of, put_int, rewrite};
use super::shim::MAX_HELD;
use super::AuthorityFix;

type Field = (Vec<u8>, Vec<u8>);

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The names the encoder uses, with their first static index, if any.
const NAMES: [(&str, usize); 7] = [
    (":authority", 1),
    (":method", 2),
    (":path", 4),
    ("content-type", 31),
    ("user-agent", 58),
    ("te", 0),
    ("grpc-timeout", 0),
];
/// Static entries the encoder indexes whole (RFC 7541 Appendix A).
const STATIC_PAIRS: [(&str, &str, usize); 3] = [
    (":method", "POST", 3),
    (":path", "/", 4),
    (":scheme", "http", 6),
];

/// How one field is encoded.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// 0 indexed when the table has the pair (else incremental), 1 incremental, 2 without
    /// indexing, 3 never indexed.
    kind: u8,
    /// The name as a literal even when an index has it.
    literal_name: bool,
    huffman_name: bool,
    huffman_value: bool,
}

/// A reference HPACK encoder with its own dynamic table (newest first).
#[derive(Default)]
struct Encoder {
    table: VecDeque<Field>,
    size: usize,
    max: usize,
}

impl Encoder {
    fn new() -> Encoder {
        Encoder {
            max: 4096,
            ..Encoder::default()
        }
    }

    fn encode(&mut self, fields: &[(Field, Plan)], size_update: Option<usize>) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(max) = size_update {
            put_int(&mut out, max, 5, 0x20);
            self.max = max;
            self.evict(0);
        }
        for ((name, value), plan) in fields {
            let pair = self.pair_index(name, value);
            if plan.kind == 0 {
                if let Some(i) = pair {
                    put_int(&mut out, i, 7, 0x80);
                    continue;
                }
            }
            let (prefix, flags) = match plan.kind {
                0 | 1 => (6, 0x40),
                2 => (4, 0x00),
                _ => (4, 0x10),
            };
            match self.name_index(name).filter(|_| !plan.literal_name) {
                Some(i) => put_int(&mut out, i, prefix, flags),
                None => {
                    out.push(flags);
                    put_string(&mut out, name, plan.huffman_name);
                }
            }
            put_string(&mut out, value, plan.huffman_value);
            if prefix == 6 {
                self.insert(name.clone(), value.clone());
            }
        }
        out
    }

    fn pair_index(&self, name: &[u8], value: &[u8]) -> Option<usize> {
        STATIC_PAIRS
            .iter()
            .find(|(n, v, _)| n.as_bytes() == name && v.as_bytes() == value)
            .map(|p| p.2)
            .or_else(|| {
                self.table
                    .iter()
                    .position(|(n, v)| n == name && v == value)
                    .map(|i| 62 + i)
            })
    }

    /// Static for every name; dynamic too, but never for `:authority` (as grpc-go, whose
    /// static search finds index 1 first).
    fn name_index(&self, name: &[u8]) -> Option<usize> {
        let fixed = NAMES
            .iter()
            .find(|(n, i)| n.as_bytes() == name && *i > 0)
            .map(|p| p.1);
        fixed.or_else(|| {
            (name != b":authority")
                .then(|| self.table.iter().position(|(n, _)| n == name))
                .flatten()
                .map(|i| 62 + i)
        })
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = 32 + name.len() + value.len();
        self.evict(size);
        if size <= self.max {
            self.size += size;
            self.table.push_front((name, value));
        }
    }

    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= 32 + n.len() + v.len();
        }
    }
}

fn put_string(out: &mut Vec<u8>, s: &[u8], huffman: bool) {
    if huffman {
        let mut coded = Vec::new();
        httlib_huffman::encode(s, &mut coded).unwrap();
        put_int(out, coded.len(), 7, 0x80);
        out.extend_from_slice(&coded);
    } else {
        put_int(out, s.len(), 7, 0);
        out.extend_from_slice(s);
    }
}

/// What the server must see: `:authority` values with a scheme cut.
fn expected(fields: &[(Field, Plan)]) -> Vec<Field> {
    fields
        .iter()
        .map(|((n, v), _)| match host_of(v) {
            Some(host) if n == b":authority" => (n.clone(), host.to_vec()),
            _ => (n.clone(), v.clone()),
        })
        .collect()
}

/// How one block is framed.
#[derive(Debug, Clone)]
struct Framing {
    /// Where the fragment is cut into CONTINUATION frames (fractions of its length).
    cuts: Vec<f64>,
    padding: Option<u8>,
    priority: bool,
    end_stream: bool,
    /// A DATA frame of this many bytes follows the block.
    data: usize,
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The frames of `block` on `stream` as `framing` says.
fn framed(out: &mut Vec<u8>, stream: u32, block: &[u8], framing: &Framing) {
    let mut cuts: Vec<usize> = framing
        .cuts
        .iter()
        .map(|f| (f * block.len() as f64) as usize)
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::new();
    let mut from = 0;
    for cut in cuts {
        pieces.push(&block[from..cut]);
        from = cut;
    }
    pieces.push(&block[from..]);
    let mut first = Vec::new();
    let mut flags = 0;
    if let Some(pad) = framing.padding {
        flags |= 0x8;
        first.push(pad);
    }
    if framing.priority {
        flags |= 0x20;
        first.extend_from_slice(&[0x80, 0, 0, 0, 200]);
    }
    first.extend_from_slice(pieces[0]);
    first.extend(std::iter::repeat_n(
        0,
        usize::from(framing.padding.unwrap_or(0)),
    ));
    if framing.end_stream {
        flags |= 0x1;
    }
    if pieces.len() == 1 {
        flags |= 0x4;
    }
    frame(out, 0x1, flags, stream, &first);
    for (i, piece) in pieces.iter().enumerate().skip(1) {
        let end = if i + 1 == pieces.len() { 0x4 } else { 0 };
        frame(out, 0x9, end, stream, piece);
    }
    if framing.data > 0 {
        frame(out, 0x0, 0x1, stream, &vec![0xAB; framing.data]);
    }
}

/// A frame stream taken apart: its header blocks, each with its stream, and every other
/// frame as it is.
type Unframed = (Vec<(u32, Vec<u8>)>, Vec<Vec<u8>>);

/// The parts of a frame stream (after the preface).
fn unframe(mut s: &[u8]) -> Unframed {
    s = s.strip_prefix(PREFACE).expect("the preface");
    let (mut blocks, mut others) = (Vec::new(), Vec::new());
    let mut open: Option<(u32, Vec<u8>)> = None;
    while !s.is_empty() {
        let len = usize::from(s[0]) << 16 | usize::from(s[1]) << 8 | usize::from(s[2]);
        let (kind, flags) = (s[3], s[4]);
        let stream = u32::from_be_bytes([s[5], s[6], s[7], s[8]]);
        let payload = &s[9..9 + len];
        match kind {
            0x1 => {
                let mut p = payload;
                let mut pad = 0;
                if flags & 0x8 != 0 {
                    pad = usize::from(p[0]);
                    p = &p[1..];
                }
                if flags & 0x20 != 0 {
                    p = &p[5..];
                }
                open = Some((stream, p[..p.len() - pad].to_vec()));
            }
            0x9 => open.as_mut().unwrap().1.extend_from_slice(payload),
            _ => others.push(s[..9 + len].to_vec()),
        }
        if matches!(kind, 0x1 | 0x9) && flags & 0x4 != 0 {
            blocks.push(open.take().unwrap());
        }
        s = &s[9 + len..];
    }
    (blocks, others)
}

/// A client byte stream in chunks, `Pending` before some of them.
struct Chunked {
    chunks: VecDeque<Vec<u8>>,
    pending: VecDeque<bool>,
}

impl AsyncRead for Chunked {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.pop_front() == Some(true) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Some(mut chunk) = this.chunks.pop_front() {
            let n = chunk.len().min(buf.remaining());
            buf.put_slice(&chunk[..n]);
            if n < chunk.len() {
                this.chunks.push_front(chunk.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// Everything h2 would read from `input` cut at `cuts`, through the shim, into buffers of
/// `room` bytes.
fn through_shim(input: &[u8], cuts: &[usize], pendings: &[bool], rooms: &[usize]) -> Vec<u8> {
    let mut chunks = VecDeque::new();
    let mut from = 0;
    let mut cuts = cuts.to_vec();
    cuts.sort_unstable();
    for cut in cuts.into_iter().filter(|c| *c < input.len()) {
        chunks.push_back(input[from..cut.max(from)].to_vec());
        from = cut.max(from);
    }
    chunks.push_back(input[from..].to_vec());
    chunks.retain(|c| !c.is_empty());
    let mut inner = Chunked {
        chunks,
        pending: pendings.iter().copied().collect(),
    };
    let mut fix = AuthorityFix::default();
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    let mut out = Vec::new();
    let mut turn = 0;
    loop {
        let room = rooms
            .get(turn % rooms.len().max(1))
            .copied()
            .unwrap_or(8192);
        turn += 1;
        let mut space = vec![0u8; room];
        let mut buf = ReadBuf::new(&mut space);
        match fix.poll_read(Pin::new(&mut inner), &mut cx, &mut buf) {
            Poll::Pending => continue,
            Poll::Ready(r) => r.unwrap(),
        }
        if buf.filled().is_empty() {
            return out;
        }
        out.extend_from_slice(buf.filled());
    }
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (0..NAMES.len()).prop_map(|i| NAMES[i].0.as_bytes().to_vec()),
        "x-[a-z]{1,8}".prop_map(String::into_bytes),
    ]
}

fn authority() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "(http|https|unix)://[a-z0-9.]{1,12}:[0-9]{1,5}".prop_map(String::into_bytes),
        "https?://[a-z0-9.]{1,12}(:[0-9]{1,5})?[/?#][a-z/]{0,8}".prop_map(String::into_bytes),
        "[a-z0-9.]{1,12}:[0-9]{1,5}".prop_map(String::into_bytes),
        Just(b"http://".to_vec()),
    ]
}

fn field() -> impl Strategy<Value = (Field, Plan)> {
    let pair = prop_oneof![
        3 => authority().prop_map(|v| (b":authority".to_vec(), v)),
        1 => Just((b":method".to_vec(), b"POST".to_vec())),
        1 => Just((b":scheme".to_vec(), b"http".to_vec())),
        4 => (name(), proptest::collection::vec(any::<u8>(), 0..24)),
    ];
    let plan =
        (0u8..4, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(k, l, hn, hv)| Plan {
            kind: k,
            literal_name: l,
            huffman_name: hn,
            huffman_value: hv,
        });
    (pair, plan)
}

/// A block: its fields, a size update before them, its framing.
fn block() -> impl Strategy<Value = (Vec<(Field, Plan)>, Option<usize>, Framing)> {
    let size_update =
        prop_oneof![4 => Just(None), 1 => (0usize..400).prop_map(Some), 1 => Just(Some(4096))];
    let framing = (
        proptest::collection::vec(0.0f64..1.0, 0..3),
        proptest::option::of(any::<u8>()),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0usize), 1usize..40, Just(16_384)],
    )
        .prop_map(|(cuts, padding, priority, end_stream, data)| Framing {
            cuts,
            padding,
            priority,
            end_stream,
            data,
        });
    (
        // At least one field: loona-hpack refuses a block of a size update alone.
        proptest::collection::vec(field(), 1..10),
        size_update,
        framing,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Block by block (the table state carried across blocks): the rewritten blocks decode
    /// to the client's header lists but for the cut `:authority` values, and a block
    /// without one is not rewritten.
    #[test]
    fn rewritten_blocks_decode_to_the_clients_lists(
        blocks in proptest::collection::vec(block(), 1..8),
    ) {
        let mut encoder = Encoder::new();
        let mut decoder = loona_hpack::Decoder::new();
        for (fields, size_update, _) in &blocks {
            let block = encoder.encode(fields, *size_update);
            let fixed = rewrite(&block);
            let schemed = fields.iter().any(|((n, v), _)| n == b":authority" && host_of(v).is_some());
            // (A block may name such a field by its table entry: nothing to rewrite.)
            prop_assert!(schemed || fixed.is_none());
            if let Some(f) = &fixed {
                prop_assert!(f.len() <= block.len());
            }
            let decoded = decoder.decode(fixed.as_deref().unwrap_or(&block)).unwrap();
            prop_assert_eq!(decoded, expected(fields));
        }
    }

    /// The whole read side: frames split, padded and with priority, DATA between them,
    /// read in random chunks into buffers of random sizes (some smaller than a frame).
    #[test]
    fn the_shim_passes_every_frame_and_rewrites_only_authority(
        blocks in proptest::collection::vec(block(), 1..6),
        cuts in proptest::collection::vec(0usize..40_000, 0..12),
        pendings in proptest::collection::vec(any::<bool>(), 0..20),
        rooms in proptest::collection::vec(prop_oneof![1usize..16, 16usize..200, Just(8192), Just(65_536)], 1..4),
    ) {
        let mut encoder = Encoder::new();
        let mut input = PREFACE.to_vec();
        frame(&mut input, 0x4, 0, 0, &[0, 4, 0, 0, 0xFF, 0xFF]);
        let mut want = Vec::new();
        for (i, (fields, size_update, framing)) in blocks.iter().enumerate() {
            let block = encoder.encode(fields, *size_update);
            framed(&mut input, 2 * i as u32 + 1, &block, framing);
            want.push(expected(fields));
        }
        let output = through_shim(&input, &cuts, &pendings, &rooms);
        let (sent, sent_others) = unframe(&input);
        let (got, got_others) = unframe(&output);
        prop_assert_eq!(got_others, sent_others);
        prop_assert_eq!(got.len(), sent.len());
        let mut decoder = loona_hpack::Decoder::new();
        for (((stream, block), (sent_stream, _)), want) in got.iter().zip(&sent).zip(&want) {
            prop_assert_eq!(stream, sent_stream);
            prop_assert_eq!(&decoder.decode(block).unwrap(), want);
        }
        let schemed = blocks
            .iter()
            .flat_map(|b| &b.0)
            .any(|((n, v), _)| n == b":authority" && host_of(v).is_some());
        if !schemed {
            // Nothing to rewrite: every byte passes as it came.
            prop_assert_eq!(output, input);
        }
    }
}

/// An `:authority` literal, as etcdctl 3.4's Status call sends it (grpc-go: static
/// name index 1, incremental indexing, Huffman-coded value).
fn status_block(encoder: &mut Encoder, authority: &str) -> Vec<u8> {
    let plan = |kind, huffman_value| Plan {
        kind,
        literal_name: false,
        huffman_name: true,
        huffman_value,
    };
    let fields = [
        ((b":method".to_vec(), b"POST".to_vec()), plan(0, true)),
        ((b":scheme".to_vec(), b"http".to_vec()), plan(0, true)),
        (
            (
                b":path".to_vec(),
                b"/etcdserverpb.Maintenance/Status".to_vec(),
            ),
            plan(1, true),
        ),
        (
            (b":authority".to_vec(), authority.as_bytes().to_vec()),
            plan(0, true),
        ),
        (
            (b"content-type".to_vec(), b"application/grpc".to_vec()),
            plan(0, true),
        ),
        (
            (b"user-agent".to_vec(), b"grpc-go/1.26.0".to_vec()),
            plan(0, true),
        ),
        ((b"te".to_vec(), b"trailers".to_vec()), plan(0, true)),
    ];
    encoder.encode(&fields, None)
}

#[test]
fn etcdctl_3_4_status_authority_is_cut_to_host_and_port() {
    let mut encoder = Encoder::new();
    let block = status_block(&mut encoder, "http://127.0.0.1:2379");
    let fixed = rewrite(&block).expect("rewritten");
    let decoded = loona_hpack::Decoder::new().decode(&fixed).unwrap();
    assert_eq!(
        decoded[3],
        (b":authority".to_vec(), b"127.0.0.1:2379".to_vec())
    );
    // The second call indexes the entry: nothing to rewrite, and it decodes to the cut
    // value from the table.
    assert!(rewrite(&status_block(&mut encoder, "http://127.0.0.1:2379")).is_none());
}

/// A connection that does not open with HTTP/2's preface (HTTP/1.1 for `/proxy/health`
/// or `/metrics`) passes byte for byte, however it is cut, even where its bytes would read
/// as a header block to rewrite; a preface cut anywhere still turns the walk on.
#[test]
fn a_connection_without_the_preface_passes_unchanged() {
    let mut encoder = Encoder::new();
    let block = status_block(&mut encoder, "http://127.0.0.1:2379");
    // 24 bytes, as long as the preface, then a frame that would be rewritten.
    let mut input = b"GET /proxy/health HTTP/1".to_vec();
    frame(&mut input, 0x1, 0x4, 1, &block);
    for cut in 0..input.len() {
        assert_eq!(
            through_shim(&input, &[cut], &[], &[8192]),
            input,
            "cut at {cut}"
        );
    }
    let mut h2 = PREFACE.to_vec();
    frame(&mut h2, 0x1, 0x4, 1, &block);
    for cut in [1, 3, 23, 24, 25] {
        assert_ne!(through_shim(&h2, &[cut], &[], &[8192]), h2, "cut at {cut}");
    }
}

#[test]
fn a_block_that_cannot_be_read_is_left_alone() {
    // A literal `:authority` whose Huffman string is cut short, and one with an invalid
    // padding (all zeros).
    assert_eq!(rewrite(&[0x41, 0x85, 0xFF]), None);
    assert_eq!(rewrite(&[0x41, 0x81, 0x00]), None);
    // An integer that never ends.
    assert_eq!(rewrite(&[0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]), None);
}

#[test]
fn a_block_too_large_to_hold_passes_unchanged() {
    let mut encoder = Encoder::new();
    let plan = Plan {
        kind: 2,
        literal_name: true,
        huffman_name: false,
        huffman_value: false,
    };
    let big = vec![b'v'; MAX_HELD];
    let fields = [
        ((b":authority".to_vec(), b"http://h:1".to_vec()), plan),
        ((b"x-big".to_vec(), big), plan),
    ];
    let block = encoder.encode(&fields, None);
    let mut input = PREFACE.to_vec();
    let framing = Framing {
        cuts: vec![0.5],
        padding: None,
        priority: false,
        end_stream: true,
        data: 0,
    };
    framed(&mut input, 1, &block, &framing);
    assert_eq!(through_shim(&input, &[100, 5000], &[], &[8192]), input);
}

#[test]
fn a_frame_inside_a_block_passes_it_unchanged() {
    // HEADERS without END_HEADERS, then a DATA frame: h2 refuses the connection.
    let mut encoder = Encoder::new();
    let block = status_block(&mut encoder, "http://127.0.0.1:2379");
    let mut input = PREFACE.to_vec();
    frame(&mut input, 0x1, 0, 1, &block);
    frame(&mut input, 0x0, 0, 1, b"x");
    frame(&mut input, 0x9, 0x4, 1, b"");
    assert_eq!(through_shim(&input, &[30, 31], &[], &[8192]), input);
}

/// Reads all of `input`, cut in reads of `read` bytes, into one buffer of that size,
/// through the shim or straight; returns the bytes read.
fn read_all(input: &[u8], read: usize, shim: bool) -> usize {
    let mut inner = Chunked {
        chunks: input.chunks(read).map(<[u8]>::to_vec).collect(),
        pending: VecDeque::new(),
    };
    let mut fix = AuthorityFix::default();
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    let mut space = vec![0u8; read];
    let mut total = 0;
    loop {
        let mut buf = ReadBuf::new(&mut space);
        let polled = if shim {
            fix.poll_read(Pin::new(&mut inner), &mut cx, &mut buf)
        } else {
            Pin::new(&mut inner).poll_read(&mut cx, &mut buf)
        };
        assert!(matches!(polled, Poll::Ready(Ok(()))));
        if buf.filled().is_empty() {
            return total;
        }
        total += std::hint::black_box(buf.filled()).len();
    }
}

/// The shim's cost per request on a connection of grpc-go unary calls: each a HEADERS
/// frame (its fields indexed from the dynamic table after the first call, a fresh
/// `grpc-timeout`) and a DATA frame, read 16 KiB at a time; and when every call's
/// `:authority` is a literal with a scheme (each block rewritten). Printed; the figures
/// that count are those of `--release`.
#[test]
fn cost_per_request() {
    const CALLS: usize = 20_000;
    const READ: usize = 16_384;
    let call = |encoder: &mut Encoder, authority: &str, kind: u8, i: usize| {
        let plan = Plan {
            kind: 0,
            literal_name: false,
            huffman_name: true,
            huffman_value: true,
        };
        let fields = [
            ((b":method".to_vec(), b"POST".to_vec()), plan),
            ((b":scheme".to_vec(), b"http".to_vec()), plan),
            (
                (b":path".to_vec(), b"/etcdserverpb.KV/Range".to_vec()),
                plan,
            ),
            (
                (b":authority".to_vec(), authority.as_bytes().to_vec()),
                Plan { kind, ..plan },
            ),
            (
                (b"content-type".to_vec(), b"application/grpc".to_vec()),
                plan,
            ),
            ((b"user-agent".to_vec(), b"grpc-go/1.83.2".to_vec()), plan),
            ((b"te".to_vec(), b"trailers".to_vec()), plan),
            (
                (
                    b"grpc-timeout".to_vec(),
                    format!("{}m", 4000 + i % 1000).into_bytes(),
                ),
                Plan { kind: 2, ..plan },
            ),
        ];
        encoder.encode(&fields, None)
    };
    let stream = |authority: &str, kind: u8| {
        let mut encoder = Encoder::new();
        let mut input = PREFACE.to_vec();
        for i in 0..CALLS {
            let id = (2 * i + 1) as u32;
            frame(
                &mut input,
                0x1,
                0x4,
                id,
                &call(&mut encoder, authority, kind, i),
            );
            let range = [0, 0, 0, 0, 7, 10, 5, b'/', b'k', b'e', b'y', b'1'];
            frame(&mut input, 0x0, 0x1, id, &range);
        }
        input
    };
    let plain = stream("127.0.0.1:2379", 0);
    let schemed = stream("http://127.0.0.1:2379", 2);
    let time = |input: &[u8], shim: bool| {
        let best = (0..7)
            .map(|_| {
                let at = Instant::now();
                let n = read_all(input, READ, shim);
                let took = at.elapsed();
                assert!(n > 0);
                took
            })
            .min()
            .unwrap();
        best.as_nanos() as f64 / CALLS as f64
    };
    let (straight, through) = (time(&plain, false), time(&plain, true));
    let (straight_schemed, rewriting) = (time(&schemed, false), time(&schemed, true));
    eprintln!(
        "authority shim, per unary call ({} bytes; 16 KiB reads){}: {:.0} ns read through \
         it vs {:.0} ns straight (+{:.0} ns); every call's :authority rewritten ({} bytes): \
         {:.0} ns vs {:.0} ns (+{:.0} ns)",
        plain.len() / CALLS,
        if cfg!(debug_assertions) {
            " [debug build]"
        } else {
            ""
        },
        through,
        straight,
        through - straight,
        schemed.len() / CALLS,
        rewriting,
        straight_schemed,
        rewriting - straight_schemed,
    );
}
