//! What a trace event does to device memory, as the library sees the call:
//! one rule for the driver (the Tier's ranges), the window floor and the
//! discard what-if.

use u3m_core::trace::{Body, CopyKind};

use super::drive::ALIAS_CHECK_MAX;

/// The call reads the bytes (before it writes any).
pub const R: u8 = 1;
/// The call writes the bytes (alone: all of them, without reading them).
pub const W: u8 = 2;

/// The device ranges `body` touches, in order — an operator's inputs, then
/// its outputs —, as (address, bytes, R | W). An operator's output
/// overlapping none of its inputs is written whole (W): acl_replay launches
/// every line as a byte-range operator that writes each output byte (the
/// simulator's kern_hash_run) through a 1-D UINT8 description of its
/// length, which the library marks whole (src/hooks/op.rs); one overlapping
/// an input is read and written (R | W), and so is every output past
/// `ALIAS_CHECK_MAX` input × output pairs (the library's bound). A copy
/// writes its destination whole and reads its source; a memset writes its
/// range whole. Allocations, frees and host-to-host copies touch nothing.
pub fn ranges(body: &Body) -> Vec<(u64, u64, u8)> {
    match body {
        Body::Alloc { .. } | Body::Free { .. } => Vec::new(),
        Body::Op {
            inputs, outputs, ..
        } => {
            let check = inputs.len() * outputs.len() <= ALIAS_CHECK_MAX;
            let read = |o: &u3m_core::trace::Range| {
                !check
                    || inputs
                        .iter()
                        .any(|i| i.addr < o.addr + o.bytes && o.addr < i.addr + i.bytes)
            };
            inputs
                .iter()
                .map(|r| (r.addr, r.bytes, R))
                .chain(
                    outputs
                        .iter()
                        .map(|o| (o.addr, o.bytes, if read(o) { R | W } else { W })),
                )
                .collect()
        }
        Body::Copy {
            kind,
            dst,
            src,
            bytes,
        } => match kind {
            CopyKind::H2D => vec![(*dst, *bytes, W)],
            CopyKind::D2H => vec![(*src, *bytes, R)],
            CopyKind::D2D => vec![(*src, *bytes, R), (*dst, *bytes, W)],
            CopyKind::H2H => Vec::new(),
        },
        Body::Set { addr, bytes } => vec![(*addr, *bytes, W)],
    }
}
