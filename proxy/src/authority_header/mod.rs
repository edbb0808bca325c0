//! An `:authority` with a scheme, as etcd 3.4's clientv3 sends it, made acceptable to h2
//! (issue 42).
//!
//! etcdctl 3.4 (and any client on clientv3 3.4) sends the endpoint it was given, scheme
//! and all, as the HTTP/2 `:authority` of the calls it makes to one named endpoint:
//! `endpoint status` (Maintenance/Status) and `endpoint hashkv` (Maintenance/HashKV)
//! with `--endpoints http://127.0.0.1:2379` send `:authority: http://127.0.0.1:2379`.
//! etcd's grpc-go server takes any `:authority`; h2 (under hyper and tonic) parses it as
//! an `http::uri::Authority` and resets the stream with `PROTOCOL_ERROR` when it does not
//! parse ("malformed authority ... invalid uri character"), and no setting of h2, hyper
//! or tonic turns that check off. So each accepted connection's read side
//! ([`AuthorityFix`], hooked in `conn.rs` below plain TCP and TLS alike) follows the
//! client's HTTP/2 frames and, in a header block whose `:authority` value contains `://`,
//! cuts the value to what follows the scheme, without a path: `127.0.0.1:2379`, the
//! value those clients send to every other call. The proxy never reads `:authority`; the
//! rewrite only keeps h2 from refusing the call.
//!
//! ## What is rewritten
//! The value of a literal field (with incremental indexing, without indexing or never
//! indexed) whose name is static index 1 or the literal name `:authority`, when the value
//! contains `://`; the block is re-emitted as one HEADERS frame (CONTINUATION frames when
//! it exceeds 16 KiB) with the first frame's flags and priority and without its padding.
//! Every other frame, every other block and every other byte of a rewritten block pass
//! as they came. Not rewritten: a field whose name is a dynamic-table index, an
//! `:authority` in a block over [`shim::MAX_HELD`] bytes or with a frame over 16 KiB (all
//! pass unchanged, and h2 refuses them as before; grpc-go names `:authority` by its
//! static index).
//!
//! ## The dynamic table stays in step
//! HPACK is stateful: an indexed field names an entry of a dynamic table that encoder and
//! decoder each keep, inserting the same entries and evicting the oldest when the table's
//! size (the entries' name and value lengths plus 32 each) would exceed the same limit.
//! A rewritten field keeps its representation, so h2 inserts an entry exactly where the
//! client does; only the value is shorter, so h2's entry is never larger than the
//! client's. Invariant: as lists newest first, the client's table is a prefix of h2's,
//! and each of h2's entries in that prefix is the client's, rewritten or the same. It holds
//! after an insertion: the client keeps the longest run of its newest entries that fits
//! with the new one; h2's copies of that run are no larger, so they fit too and h2 evicts
//! no entry the client keeps (it may keep older ones the client evicted, past the client's
//! end). It holds after a size update, the same limit for both, by the same argument, and
//! after an entry too large for the table (the client empties its table; h2, whose
//! smaller copy may fit, keeps more). Every index the client sends names an entry of its
//! own table, so it names the same entry, in the same place, in h2's. A block that passes
//! unchanged inserts the same entries on both sides.
//!
//! ## Cost
//! The common path copies nothing: h2's buffer is read into directly and walked there;
//! the per-frame work is its 9-byte header (a DATA frame's payload is skipped by its
//! length), and a HEADERS frame's block is walked once (each field's first octets; a
//! string is skipped by its length unless it is an `:authority` value). Bytes are held
//! back only while h2 could not use them anyway (a frame header or a header block not yet
//! complete), at most [`shim::MAX_HELD`] per connection; two empty vectors otherwise.
//! Measured by `cost_per_request` (release build, 2026-12-06): a grpc-go unary call
//! (53 bytes of frames, 16 KiB reads) 59 ns through the shim against 30 ns straight; a
//! call whose block is rewritten 0.6 µs more (clientv3 3.4: the first call of a
//! connection; its later calls name the entry by index).

mod hpack;
mod shim;
#[cfg(test)]
mod tests;

pub(crate) use shim::AuthorityFix;
