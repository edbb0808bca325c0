//! The walk over one HPACK header block (RFC 7541 §6) that finds an `:authority` field
//! whose value holds a scheme and writes the block anew with only that value changed.
//!
//! Every representation is read: indexed (§6.1), literal with incremental indexing,
//! without indexing and never indexed (§6.2), each with the name by index or as a
//! literal, and the dynamic table size update (§6.3); integers with their N-bit prefixes
//! (§5.1) and strings raw or Huffman-coded (§5.2). A field is rewritten when its name is
//! `:authority` (static index 1, or a literal name) and its value contains `://`: the value
//! becomes what follows the scheme up to the first `/`, `?` or `#`. The field keeps its
//! first octet and its name bytes as they were, and its value keeps its coding (Huffman or
//! raw); every other byte of the block is copied as it is. A block this walk cannot read
//! (a truncated integer or string, a Huffman string that is not valid) is left alone, for
//! h2 to refuse as it would.

use std::borrow::Cow;

use httlib_huffman::DecoderSpeed;

/// The name the walk looks for.
const AUTHORITY: &[u8] = b":authority";
/// The Huffman code of `:authority`: a string's code is unique (its padding must be the
/// first bits of EOS, under 8), so a literal name is compared without decoding it.
const HUFFMAN_AUTHORITY: &[u8] = &[0xB8, 0x3B, 0x53, 0x39, 0xEC, 0x32, 0x7D, 0x7F];
/// `:authority`'s place in the static table (RFC 7541 Appendix A).
const AUTHORITY_INDEX: usize = 1;
/// The largest integer the walk reads (the block is bounded well below it anyway).
const MAX_INT: usize = 1 << 28;

/// `block` with every `:authority` value that holds a scheme cut to its host and port, or
/// `None` when nothing is to change (or the block cannot be read). Allocates only when
/// something changes.
pub(super) fn rewrite(block: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    // Bytes of `block` before this offset are in `out` already.
    let mut copied = 0;
    let mut at = 0;
    while at < block.len() {
        let first = block[at];
        let prefix = match first {
            // Indexed field: nothing to look at.
            b if b & 0x80 != 0 => {
                at = int(block, at, 7)?.1;
                continue;
            }
            // Dynamic table size update.
            b if b & 0xE0 == 0x20 => {
                at = int(block, at, 5)?.1;
                continue;
            }
            // Literal with incremental indexing.
            b if b & 0xC0 == 0x40 => 6,
            // Literal without indexing (0000) or never indexed (0001).
            _ => 4,
        };
        let (index, next) = int(block, at, prefix)?;
        let is_authority = if index == 0 {
            let huffman = *block.get(next)? & 0x80 != 0;
            let (name, after) = raw_string(block, next)?;
            at = after;
            name == if huffman {
                HUFFMAN_AUTHORITY
            } else {
                AUTHORITY
            }
        } else {
            at = next;
            index == AUTHORITY_INDEX
        };
        let value_at = at;
        if !is_authority {
            at = raw_string(block, value_at)?.1;
            continue;
        }
        let huffman = *block.get(value_at)? & 0x80 != 0;
        let (value, after) = string(block, value_at)?;
        at = after;
        let Some(host) = host_of(&value) else {
            continue;
        };
        tracing::trace!(
            from = %String::from_utf8_lossy(&value),
            to = %String::from_utf8_lossy(host),
            "an :authority with a scheme, cut for h2"
        );
        let out = out.get_or_insert_with(|| Vec::with_capacity(block.len()));
        out.extend_from_slice(&block[copied..value_at]);
        put_string(out, host, huffman);
        copied = after;
    }
    let mut out = out?;
    out.extend_from_slice(&block[copied..]);
    Some(out)
}

/// What an `:authority` value with a scheme becomes: after `://`, up to a path, query or
/// fragment. `None` when it has no scheme.
pub(super) fn host_of(value: &[u8]) -> Option<&[u8]> {
    let scheme_end = value.windows(3).position(|w| w == b"://")?;
    let rest = &value[scheme_end + 3..];
    let end = rest
        .iter()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The integer with an `prefix`-bit prefix starting at `block[at]`, and the offset after
/// it (RFC 7541 §5.1).
fn int(block: &[u8], at: usize, prefix: u8) -> Option<(usize, usize)> {
    let mask = (1usize << prefix) - 1;
    let mut value = usize::from(*block.get(at)?) & mask;
    let mut at = at + 1;
    if value < mask {
        return Some((value, at));
    }
    let mut shift = 0;
    loop {
        let b = *block.get(at)?;
        at += 1;
        value += usize::from(b & 0x7F) << shift;
        if value > MAX_INT {
            return None;
        }
        if b & 0x80 == 0 {
            return Some((value, at));
        }
        shift += 7;
    }
}

/// The octets of the string starting at `block[at]` as sent (Huffman-coded or not), and
/// the offset after it (RFC 7541 §5.2).
fn raw_string(block: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let (len, start) = int(block, at, 7)?;
    let end = start.checked_add(len)?;
    Some((block.get(start..end)?, end))
}

/// The string starting at `block[at]`, decoded when Huffman-coded, and the offset after
/// it (RFC 7541 §5.2).
fn string(block: &[u8], at: usize) -> Option<(Cow<'_, [u8]>, usize)> {
    let huffman = *block.get(at)? & 0x80 != 0;
    let (raw, end) = raw_string(block, at)?;
    if !huffman {
        return Some((Cow::Borrowed(raw), end));
    }
    let mut decoded = Vec::with_capacity(raw.len() * 8 / 5 + 1);
    httlib_huffman::decode(raw, &mut decoded, DecoderSpeed::FourBits).ok()?;
    Some((Cow::Owned(decoded), end))
}

/// Appends `value` as an HPACK string, Huffman-coded when `huffman`. Never longer than
/// the string it replaces when `value` is part of that string: its code is part of that
/// string's code, and its length prefix no longer.
fn put_string(out: &mut Vec<u8>, value: &[u8], huffman: bool) {
    if huffman {
        let mut coded = Vec::with_capacity(value.len());
        // Every octet has a code, so encoding cannot fail.
        if httlib_huffman::encode(value, &mut coded).is_ok() {
            put_int(out, coded.len(), 7, 0x80);
            out.extend_from_slice(&coded);
            return;
        }
    }
    put_int(out, value.len(), 7, 0);
    out.extend_from_slice(value);
}

/// Appends `value` with a `prefix`-bit prefix, the octet's other bits `flags`
/// (RFC 7541 §5.1).
pub(super) fn put_int(out: &mut Vec<u8>, value: usize, prefix: u8, flags: u8) {
    let mask = (1usize << prefix) - 1;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest & 0x7F) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_huffman_code_of_authority_is_the_encoders() {
        let mut coded = Vec::new();
        httlib_huffman::encode(super::AUTHORITY, &mut coded).unwrap();
        assert_eq!(coded, super::HUFFMAN_AUTHORITY);
    }
}
