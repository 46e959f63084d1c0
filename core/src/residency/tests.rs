//! The residency protocol driven through the fake runtime (`fake.rs`): each
//! test plays a program the way libu3m.so's hooks drive the manager
//! (`prepare`, the real call, `finish`) and checks the bytes the program
//! reads back, the copies that crossed the link, and that nothing ever ran
//! on unmapped memory or misused the runtime.

use super::fake::{Fake, Kernel, Mem};
use super::*;
use crate::engine::runtime::CHUNK;
use crate::engine::Range;
use crate::opclass::OpClass;
use crate::policy::Touch;

const MIB: u64 = 1 << 20;

/// The fake runtime saw no misuse of its API and no device fault.
#[track_caller]
fn assert_no_misuse_or_fault(s: &super::fake::Seen) {
    assert!(s.misuse.is_empty(), "misuse: {:#?}", s.misuse);
    assert!(s.faults.is_empty(), "faults: {:#?}", s.faults);
}

fn config(vars: &[(&str, &str)]) -> Config {
    let mut v: std::collections::BTreeMap<String, String> = [
        ("U3M_MODE", "tier"),
        ("U3M_POLICY", "lru"),
        ("U3M_ALLOC_WAIT_MS", "0"),
        ("U3M_MIN_BYTES", "1M"),
        ("U3M_OVERSUB", "16"),
        ("U3M_DRAM_BYTES", "256M"),
        ("U3M_LOG", "quiet"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    v.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::from_vars(v).expect("config")
}

/// Bytes of a deterministic pattern.
fn pattern(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A synchronous (host-ordered) call on `dev`, as an aclrtMemcpy: writes
/// `data` at `va` (overwriting it) or reads `len` bytes there — prepare, the
/// access through the fake runtime, finish.
fn sync_call(
    r: &Residency,
    f: &Fake,
    dev: u32,
    va: u64,
    len: u64,
    data: Option<&[u8]>,
) -> Result<Vec<u8>, AclError> {
    let rs = [Range {
        addr: va,
        len,
        write: data.is_some(),
        whole: false,
    }];
    let tok = r.prepare(dev, OpClass::Layout as u8, &rs, data.is_some(), Order::Host)?;
    let out = match data {
        Some(d) => f.app_write(va, d).map(|()| Vec::new()),
        None => f.app_read(va, len),
    };
    r.finish(tok, None, out.is_ok());
    out
}

/// A program on the fake runtime, calling the manager as the hooks do.
struct App {
    r: Residency,
    f: &'static Fake,
}

impl App {
    fn new(hbm_chunks: u64, vars: &[(&str, &str)]) -> App {
        let f = Fake::leak(1, hbm_chunks * CHUNK);
        let r = Residency::new(f, &config(vars)).expect("residency");
        App { r, f }
    }

    /// With a policy object of the test's.
    fn with_policy(hbm_chunks: u64, policy: Box<dyn crate::policy::Placement>) -> App {
        App::with_policy_vars(hbm_chunks, policy, &[])
    }

    fn with_policy_vars(
        hbm_chunks: u64,
        policy: Box<dyn crate::policy::Placement>,
        vars: &[(&str, &str)],
    ) -> App {
        let f = Fake::leak(1, hbm_chunks * CHUNK);
        let r = Residency::with_policy(f, &config(vars), policy).expect("residency");
        App { r, f }
    }

    fn malloc(&self, bytes: u64) -> u64 {
        let (free, total) = self.f.mem_info().unwrap();
        self.r
            .malloc(0, bytes, free, total)
            .expect("managed")
            .expect("allocated")
    }

    fn free(&self, va: u64) {
        assert_eq!(self.r.free(va), Some(Ok(())));
    }

    /// A synchronous call (the host waits for u3m's copies).
    fn sync<T>(
        &self,
        ranges: &[Range],
        overwrite: bool,
        call: impl FnOnce() -> Result<T, AclError>,
    ) -> Result<T, AclError> {
        let tok = self
            .r
            .prepare(0, OpClass::Layout as u8, ranges, overwrite, Order::Host)?;
        let out = call();
        self.r.finish(tok, None, out.is_ok());
        out
    }

    /// aclrtMemcpy host to device.
    fn write(&self, va: u64, data: &[u8]) {
        let rs = [Range {
            addr: va,
            len: data.len() as u64,
            write: true,
            whole: false,
        }];
        self.sync(&rs, true, || self.f.app_write(va, data))
            .expect("write");
    }

    /// aclrtMemcpy device to host.
    fn read(&self, va: u64, len: u64) -> Vec<u8> {
        let rs = [Range {
            addr: va,
            len,
            write: false,
            whole: false,
        }];
        self.sync(&rs, true, || self.f.app_read(va, len))
            .expect("read")
    }

    /// An operator on `stream`: reads `ins`, writes `outs` when it runs.
    fn op(&self, stream: u64, ins: &[(u64, u64)], outs: &[(u64, u64)], k: Kernel) {
        self.try_op(stream, ins, outs, k).expect("op");
    }

    fn try_op(
        &self,
        stream: u64,
        ins: &[(u64, u64)],
        outs: &[(u64, u64)],
        k: Kernel,
    ) -> Result<(), AclError> {
        let ranges = op_ranges(ins, outs);
        let tok = self.r.prepare(
            0,
            OpClass::Elementwise as u8,
            &ranges,
            false,
            Order::Stream(stream),
        )?;
        let all = ins.iter().chain(outs).copied().collect();
        let rc = self.f.app_launch(stream, "op", all, k);
        self.r.finish(tok, Some(stream), rc.is_ok());
        rc
    }

    /// Nothing ran on unmapped memory, nothing misused the runtime.
    fn assert_clean(&self) {
        let s = self.f.seen();
        assert!(s.faults.is_empty(), "faults: {:#?}", s.faults);
        assert!(s.misuse.is_empty(), "misuse: {:#?}", s.misuse);
    }
}

/// dst = src + add, byte by byte.
fn add(src: u64, dst: u64, len: u64, add: u8) -> Kernel {
    Box::new(move |m: &mut Mem<'_>| {
        let v: Vec<u8> = m
            .read(src, len)
            .iter()
            .map(|b| b.wrapping_add(add))
            .collect();
        m.write(dst, &v);
    })
}

#[test]
fn data_survives_evict_and_fault_in_cycles() {
    evict_and_fault_in_cycles(false);
    evict_and_fault_in_cycles(true);
}

/// `eager`: the device runs work as soon as it is queued (else only when
/// something synchronises).
fn evict_and_fault_in_cycles(eager: bool) {
    // 8 chunks of allocations on a 4-chunk device, partial last chunks
    let a = App::new(4, &[]);
    a.f.set_eager(eager);
    let sizes = [5 * MIB, 2 * MIB, 4 * MIB, 3 * MIB];
    let vas: Vec<u64> = sizes.iter().map(|&s| a.malloc(s)).collect();
    let mut model: Vec<Vec<u8>> = Vec::new();
    for (k, (&va, &s)) in vas.iter().zip(&sizes).enumerate() {
        let p = pattern(k as u64, s);
        a.write(va, &p);
        model.push(p);
    }
    let s = a.f.app_stream();
    for round in 0..3u8 {
        for k in 0..vas.len() {
            // reads back what was written, from wherever it is
            assert_eq!(
                a.read(vas[k], sizes[k]),
                model[k],
                "round {round} alloc {k}"
            );
            // an operator transforms it in place on the program's stream
            let (va, len) = (vas[k], sizes[k]);
            a.op(s, &[(va, len)], &[(va, len)], add(va, va, len, round + 1));
            model[k]
                .iter_mut()
                .for_each(|b| *b = b.wrapping_add(round + 1));
        }
    }
    a.f.sync_stream(s).unwrap();
    for k in 0..vas.len() {
        assert_eq!(a.read(vas[k], sizes[k]), model[k], "final alloc {k}");
    }
    let c = a.r.counters();
    assert!(c.evictions >= 20 && c.faults_in >= 20, "{c:?}");
    assert_eq!(c.to_dram, c.evictions - c.clean_drops);
    a.assert_clean();
    for va in vas {
        a.free(va);
    }
    assert_eq!(a.f.held().0, 0, "every physical chunk given back");
    a.assert_clean();
}

/// U3M_HANDOFF=on: operators in flight on the program's stream (the lazy
/// fake runs nothing until something synchronises), and a victim's HBM
/// handed to the next fault-in before its copy-out lands (`take_outgoing`),
/// that copy-in ordered after it on the device. Every byte survives and
/// nothing runs on unmapped memory, eager or lazy, and with the program's
/// host waits noted (`program_waits_on_host`).
#[test]
fn a_handoff_keeps_every_byte_with_operators_in_flight() {
    for (eager, host_waits) in [(false, false), (true, false), (false, true)] {
        let a = App::new(4, &[("U3M_HANDOFF", "on")]);
        a.f.set_eager(eager);
        if host_waits {
            a.r.program_waits_on_host();
        }
        let sizes = [5 * MIB, 2 * MIB, 4 * MIB, 3 * MIB, 6 * MIB];
        let vas: Vec<u64> = sizes.iter().map(|&s| a.malloc(s)).collect();
        let mut model: Vec<Vec<u8>> = Vec::new();
        for (k, (&va, &s)) in vas.iter().zip(&sizes).enumerate() {
            let p = pattern(k as u64 + 7, s);
            a.write(va, &p);
            model.push(p);
        }
        let s = a.f.app_stream();
        for round in 0..4u8 {
            for k in 0..vas.len() {
                // each allocation transformed in place, then copied into
                // the next one: reads and writes of chunks other calls
                // evict while these are queued
                let (va, len) = (vas[k], sizes[k]);
                a.op(s, &[(va, len)], &[(va, len)], add(va, va, len, round + 1));
                model[k]
                    .iter_mut()
                    .for_each(|b| *b = b.wrapping_add(round + 1));
                let n = (k + 1) % vas.len();
                let m = len.min(sizes[n]);
                a.op(s, &[(va, m)], &[(vas[n], m)], add(va, vas[n], m, 3));
                let v: Vec<u8> = model[k][..m as usize]
                    .iter()
                    .map(|b| b.wrapping_add(3))
                    .collect();
                model[n][..m as usize].copy_from_slice(&v);
            }
        }
        a.f.sync_stream(s).unwrap();
        for k in 0..vas.len() {
            assert_eq!(
                a.read(vas[k], sizes[k]),
                model[k],
                "eager {eager} host_waits {host_waits}: alloc {k}"
            );
        }
        let c = a.r.counters();
        let what = format!("eager {eager} host_waits {host_waits}: {c:?}");
        assert!(c.evictions >= 20, "{what}");
        // (the engine's own victims are never in use: only a plan orders
        // an eviction after program work, test below)
        assert_eq!(c.ordered_outs, 0, "{what}");
        if !eager {
            assert!(c.handoffs > 0, "{what}");
        }
        for va in vas {
            a.free(va);
        }
        a.f.drain();
        assert_eq!(
            a.f.held().0,
            0,
            "eager {eager}: every physical chunk given back"
        );
        a.assert_clean();
    }
}

#[test]
fn a_clean_chunk_is_dropped_without_a_copy_out() {
    let a = App::new(2, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(2 * CHUNK);
    let px = pattern(1, CHUNK);
    a.write(x, &px);
    a.write(y, &pattern(2, 2 * CHUNK)); // x leaves HBM: copied out
    let c0 = a.r.counters();
    assert_eq!((c0.evictions, c0.clean_drops, c0.to_dram), (1, 0, 1));
    assert_eq!(a.read(x, CHUNK), px); // x back (clean), one chunk of y out
    let c1 = a.r.counters();
    assert_eq!((c1.evictions, c1.clean_drops), (2, 0));
    let d2h = a.f.seen().d2h;
    // y needs both chunks: x goes again, clean this time
    a.read(y, 2 * CHUNK);
    let c2 = a.r.counters();
    assert_eq!(c2.clean_drops, 1, "{c2:?}");
    assert_eq!(c2.eviction_bytes, c1.eviction_bytes, "nothing copied out");
    assert_eq!(a.f.seen().d2h, d2h + 1, "only the program's own read");
    assert_eq!(a.read(x, CHUNK), px);
    a.assert_clean();
}

#[test]
fn a_discarded_chunk_leaves_hbm_without_a_copy_out() {
    let a = App::new(2, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(2 * CHUNK);
    a.write(x, &pattern(1, CHUNK)); // in HBM only: evicting it would copy it out
    assert_eq!(a.r.discard(x, CHUNK), Some(1));
    let (c0, d2h) = (a.r.counters(), a.f.seen().d2h);
    a.write(y, &pattern(2, 2 * CHUNK)); // needs x's HBM
    let c1 = a.r.counters();
    assert_eq!(c1.evictions, c0.evictions + 1, "{c1:?}");
    assert_eq!(
        c1.clean_drops,
        c0.clean_drops + 1,
        "dropped, not copied out"
    );
    assert_eq!(
        (c1.eviction_bytes, c1.to_dram),
        (c0.eviction_bytes, c0.to_dram)
    );
    assert_eq!(a.f.seen().d2h, d2h, "no device-to-host copy");
    // written again: x holds what the program writes, y kept every byte
    let p3 = pattern(3, CHUNK);
    a.write(x, &p3);
    assert_eq!(a.read(x, CHUNK), p3);
    assert_eq!(a.read(y, 2 * CHUNK), pattern(2, 2 * CHUNK));
    a.assert_clean();
}

#[test]
fn discard_takes_whole_chunks_in_hbm_that_no_call_is_using() {
    let a = App::new(4, &[]);
    let x = a.malloc(3 * CHUNK);
    a.write(x, &pattern(1, 3 * CHUNK));
    // the first and last chunks are only partly inside
    assert_eq!(a.r.discard(x + 4096, 3 * CHUNK - 8192), Some(1));
    // the same chunk again: nothing left to discard in it
    assert_eq!(a.r.discard(x + CHUNK, CHUNK), Some(0));
    // a range running past the allocation stops at its end
    assert_eq!(a.r.discard(x + 2 * CHUNK, u64::MAX), Some(1));
    // not u3m's memory, size 0
    assert_eq!(a.r.discard(0x10, CHUNK), None);
    assert_eq!(a.r.discard(x, 0), Some(0));
    // a chunk with a current host copy (clean) keeps it
    let y = a.malloc(CHUNK);
    a.write(y, &pattern(2, CHUNK));
    let z = a.malloc(4 * CHUNK);
    a.write(z, &pattern(3, 4 * CHUNK)); // everything else leaves HBM
    assert_eq!(a.read(y, CHUNK), pattern(2, CHUNK)); // y back, clean
    assert_eq!(a.r.discard(y, CHUNK), Some(0));
    // the chunk never discarded kept its bytes through all of it
    assert_eq!(
        a.read(x, CHUNK),
        pattern(1, 3 * CHUNK)[..CHUNK as usize].to_vec()
    );
    a.assert_clean();
}

#[test]
fn a_discarded_chunk_written_again_is_copied_out_again() {
    let a = App::new(1, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    assert_eq!(a.r.discard(x, CHUNK), Some(1));
    // part of it written after the discard: dirty again
    let mid = pattern(4, 4096);
    a.write(x + 8192, &mid);
    let c0 = a.r.counters();
    a.write(y, &pattern(2, CHUNK)); // x leaves HBM: copied out
    let c1 = a.r.counters();
    assert_eq!(c1.eviction_bytes, c0.eviction_bytes + CHUNK, "{c1:?}");
    assert_eq!(a.read(x + 8192, 4096), mid);
    a.assert_clean();
}

#[test]
fn a_discarded_chunk_in_use_leaves_hbm_after_its_use() {
    let a = App::new(1, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    let s = a.f.app_stream();
    // queued, not run: x is in use until the stream gets to it; the
    // program discards it right after issuing its last use
    a.op(s, &[(x, CHUNK)], &[(x, CHUNK)], add(x, x, CHUNK, 7));
    assert_eq!(a.r.discard(x, CHUNK), Some(1));
    // y needs x's HBM: dropped only once the operator has run (else the
    // fake runtime records a fault on unmapped memory)
    a.write(y, &pattern(2, CHUNK));
    assert_eq!(a.read(y, CHUNK), pattern(2, CHUNK));
    a.assert_clean();
}

/// The hooks work out an operator's whole writes (for aclop, two getter
/// calls per output) from the moment managed memory reaches half of HBM,
/// before any eviction: what the policy learns of the first step decides
/// the second's victims. A program well inside HBM never pays for it.
#[test]
fn whole_writes_matter_from_half_of_hbm_allocated_on() {
    let a = App::new(8, &[]);
    assert!(!a.r.whole_writes_matter(), "nothing allocated");
    let x = a.malloc(3 * CHUNK);
    a.write(x, &pattern(1, 3 * CHUNK));
    assert!(!a.r.whole_writes_matter(), "3 of 8 chunks");
    let y = a.malloc(CHUNK);
    assert!(a.r.whole_writes_matter(), "4 of 8 chunks");
    assert_eq!(a.r.counters().evictions, 0);
    a.free(y);
    a.free(x);
    assert!(a.r.whole_writes_matter(), "for good");
    a.assert_clean();
}

#[test]
fn a_whole_chunk_overwrite_needs_no_copy_in_but_a_partial_one_does() {
    let a = App::new(1, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    a.write(y, &pattern(2, CHUNK)); // x to DRAM
    let before = a.r.counters();
    let p2 = pattern(3, CHUNK);
    a.write(x, &p2); // the whole chunk: its DRAM copy is not needed
    let after = a.r.counters();
    assert_eq!(after.overwrites, before.overwrites + 1);
    assert_eq!(after.fault_bytes, before.fault_bytes, "no copy-in");
    assert_eq!(a.read(x, CHUNK), p2);
    // part of a chunk: the rest must come back first
    a.read(y, CHUNK); // x out again
    let before = a.r.counters();
    let mid = pattern(4, 4096);
    a.write(x + 100_000, &mid);
    let after = a.r.counters();
    assert_eq!(after.fault_bytes, before.fault_bytes + CHUNK, "copied in");
    assert_eq!(after.overwrites, before.overwrites);
    let mut want = p2;
    want[100_000..100_000 + 4096].copy_from_slice(&mid);
    assert_eq!(a.read(x, CHUNK), want);
    a.assert_clean();
}

/// A call that writes a chunk whole gets it without its copy-in; if the
/// call then fails (the runtime refuses it: nothing is written), the chunk
/// goes back to its host copy: the program reads what it wrote before,
/// not the memory the chunk was given. Both orders: a synchronous copy and
/// a stream-ordered operator.
#[test]
fn a_whole_write_that_fails_leaves_the_chunk_as_it_was() {
    for host in [true, false] {
        let a = App::new(1, &[]);
        let x = a.malloc(CHUNK);
        let y = a.malloc(CHUNK);
        let px = pattern(1, CHUNK);
        a.write(x, &px);
        a.write(y, &pattern(2, CHUNK)); // x to DRAM
        let before = a.r.counters();
        let rs = [Range {
            addr: x,
            len: CHUNK,
            write: true,
            whole: true,
        }];
        if host {
            let r: Result<(), AclError> = a.sync(&rs, false, || Err(AclError::INVALID_PARAM));
            assert!(r.is_err());
        } else {
            let tok =
                a.r.prepare(0, OpClass::Elementwise as u8, &rs, false, Order::Stream(7))
                    .expect("prepared");
            a.r.finish(tok, Some(7), false);
        }
        let after = a.r.counters();
        assert_eq!(after.overwrites, before.overwrites + 1, "host {host}");
        assert_eq!(after.fault_bytes, before.fault_bytes, "no copy-in");
        assert_eq!(
            a.read(x, CHUNK),
            px,
            "host {host}: the failed call wrote nothing"
        );
        // and a whole write that succeeds replaces it
        let p3 = pattern(3, CHUNK);
        a.write(x, &p3);
        a.read(y, CHUNK);
        assert_eq!(a.read(x, CHUNK), p3, "host {host}");
        a.assert_clean();
    }
}

/// A call of several ranges in one chunk (an operator's small tensors, a
/// batch of copies): the chunk is overwritten whole only if every range in
/// it is a write of the whole chunk, and written if any range writes it.
#[test]
fn ranges_in_one_chunk_overwrite_it_only_if_each_is_the_whole_chunk() {
    let w = |addr, len| Range {
        addr,
        len,
        write: true,
        whole: false,
    };
    let rd = |addr, len| Range {
        addr,
        len,
        write: false,
        whole: false,
    };
    let cases = |x: u64| -> Vec<(Vec<Range>, bool)> {
        vec![
            (vec![w(x, CHUNK), w(x, CHUNK)], true),
            (vec![w(x, 4096), w(x, CHUNK)], false),
            (vec![w(x, CHUNK), w(x, 4096)], false),
            (vec![w(x, CHUNK), w(x + 4096, CHUNK - 4096)], false),
            (vec![w(x, CHUNK), w(x + 100, 4096)], false),
            (vec![w(x, CHUNK), rd(x, CHUNK)], false),
            (vec![rd(x + 8, 64), w(x, CHUNK)], false),
            (vec![rd(x + 8, 64), w(x + 100, 4096)], false),
        ]
    };
    let a = App::new(1, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    let want = pattern(1, CHUNK);
    a.write(x, &want);
    for (k, (rs, whole)) in cases(x).into_iter().enumerate() {
        a.write(y, &pattern(2, CHUNK)); // x to DRAM
        let before = a.r.counters();
        a.sync(&rs, true, || Ok::<(), AclError>(())).expect("call");
        let after = a.r.counters();
        let copied = after.fault_bytes - before.fault_bytes;
        assert_eq!(copied, if whole { 0 } else { CHUNK }, "case {k}");
        assert_eq!(
            after.overwrites - before.overwrites,
            whole as u64,
            "case {k}"
        );
        if !whole {
            // the call changed nothing: the contents came back
            assert_eq!(a.read(x, CHUNK), want, "case {k}");
        } else {
            a.write(x, &want);
        }
        // written by the call: dirty, so leaving HBM again copies it out
        let out = a.r.counters().to_dram;
        a.write(y, &pattern(3, CHUNK));
        assert_eq!(a.r.counters().to_dram, out + 1, "case {k}");
        a.read(x, CHUNK);
    }
    a.assert_clean();
}

/// An operator call (no blanket `overwrite`) mixes ranges: a chunk skips
/// its copy-in only when every range of the call covering it is a whole
/// write (`Range::whole`) of the whole chunk; a plain write, a read of it
/// (in place, an output aliasing an input) or a whole write of part of it
/// keeps the copy-in.
#[test]
fn an_operator_skips_a_copy_in_only_where_every_range_writes_the_chunk_whole() {
    let ww = |addr, len| Range {
        addr,
        len,
        write: true,
        whole: true,
    };
    let w = |addr, len| Range {
        addr,
        len,
        write: true,
        whole: false,
    };
    let rd = |addr, len| Range {
        addr,
        len,
        write: false,
        whole: false,
    };
    // (the call's ranges over x (2 chunks) and z, how many of x's chunks
    // are copied in)
    let cases = |x: u64, z: u64| -> Vec<(Vec<Range>, u64)> {
        vec![
            (vec![rd(z, 64), ww(x, 2 * CHUNK)], 0),
            (vec![ww(x, 2 * CHUNK), rd(z, 64)], 0),
            (vec![rd(z, 64), ww(x, CHUNK + 4096)], 1),
            (vec![rd(z, 64), w(x, 2 * CHUNK)], 2),
            (vec![rd(x + 8, 64), ww(x, 2 * CHUNK)], 1),
            (vec![ww(x, 2 * CHUNK), rd(x + CHUNK, 64)], 1),
            (vec![rd(x, 2 * CHUNK), ww(x, 2 * CHUNK)], 2),
            (vec![ww(x, 2 * CHUNK), w(x + 100, 4096)], 1),
            (vec![ww(x + 4096, 2 * CHUNK - 4096)], 1),
        ]
    };
    let a = App::new(4, &[]);
    let x = a.malloc(2 * CHUNK);
    let y = a.malloc(4 * CHUNK);
    // z: a read of another tensor, resident (y's first bytes)
    let z = y;
    let want = pattern(1, 2 * CHUNK);
    a.write(x, &want);
    for (k, (rs, copied)) in cases(x, z).into_iter().enumerate() {
        a.write(y, &pattern(2, 4 * CHUNK)); // x to DRAM
        let before = a.r.counters();
        a.sync(&rs, false, || Ok::<(), AclError>(())).expect("call");
        let after = a.r.counters();
        assert_eq!(
            after.fault_bytes - before.fault_bytes,
            copied * CHUNK,
            "case {k}"
        );
        assert_eq!(after.overwrites - before.overwrites, 2 - copied, "case {k}");
        if copied == 2 {
            // the call changed nothing: the contents came back
            assert_eq!(a.read(x, 2 * CHUNK), want, "case {k}");
        }
        a.write(x, &want);
    }
    a.assert_clean();
}

struct SwapDir(std::path::PathBuf);
impl SwapDir {
    fn new(name: &str) -> SwapDir {
        let p =
            std::env::temp_dir().join(format!("u3m-residency-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        SwapDir(p)
    }
}
impl Drop for SwapDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn nvme_round_trips_keep_every_byte() {
    let dir = SwapDir::new("nvme");
    let d = dir.0.display().to_string();
    // DRAM takes one chunk below its 95 % mark; the rest goes to NVMe
    let a = App::new(
        2,
        &[
            ("U3M_DRAM_BYTES", "4M"),
            ("U3M_SWAP_DIR", &d),
            ("U3M_SWAP_BYTES", "64M"),
        ],
    );
    let vas: Vec<u64> = (0..4).map(|_| a.malloc(2 * CHUNK)).collect();
    let pats: Vec<Vec<u8>> = (0..4).map(|k| pattern(10 + k, 2 * CHUNK)).collect();
    for (va, p) in vas.iter().zip(&pats) {
        a.write(*va, p);
    }
    for _ in 0..2 {
        for (va, p) in vas.iter().zip(&pats) {
            assert_eq!(&a.read(*va, 2 * CHUNK), p);
        }
    }
    let c = a.r.counters();
    assert!(c.to_nvme >= 4 && c.from_nvme >= 4, "{c:?}");
    assert_eq!(c.spill_errors, 0);
    a.assert_clean();
}

#[test]
fn a_failing_swap_keeps_data_in_dram_and_the_spill_moves_it_later() {
    let dir = SwapDir::new("spill");
    let d = dir.0.display().to_string();
    let a = App::new(
        1,
        &[
            ("U3M_DRAM_BYTES", "8M"),
            ("U3M_SWAP_DIR", &d),
            ("U3M_SWAP_BYTES", "64M"),
        ],
    );
    let faults = |f: crate::store::nvme::NvmeFaults| {
        let mut st = a.r.shard_of(0).st.lock().unwrap();
        st.nvme.as_mut().unwrap().set_faults(f);
    };
    // every NVMe write fails: the fourth evicted chunk stays in DRAM anyway
    faults(crate::store::nvme::NvmeFaults {
        fail_writes_after_bytes: Some(0),
        ..Default::default()
    });
    let vas: Vec<u64> = (0..5).map(|_| a.malloc(CHUNK)).collect();
    for (k, &va) in vas.iter().enumerate() {
        a.write(va, &pattern(k as u64, CHUNK));
    }
    let c = a.r.counters();
    assert_eq!((c.to_dram, c.to_nvme, c.spill_errors), (4, 0, 1), "{c:?}");
    assert_eq!(a.r.usage(0).1, 8 * MIB, "DRAM full");
    // the disk recovers: the background spill brings DRAM under 90 %
    faults(Default::default());
    assert_eq!(a.r.spill_dram(1.0), 1);
    assert_eq!(a.r.usage(0).1, 6 * MIB);
    assert_eq!(a.r.usage(0).2, 2 * MIB);
    for (k, &va) in vas.iter().enumerate() {
        assert_eq!(a.read(va, CHUNK), pattern(k as u64, CHUNK), "alloc {k}");
    }
    // the spilled chunk and the one evicted after it came back from NVMe
    assert_eq!(a.r.counters().from_nvme, 2);
    a.assert_clean();
}

#[test]
fn a_vmm_handle_mapped_at_two_vas_shows_the_same_bytes_through_both() {
    let a = App::new(2, &[]);
    let h = a.r.malloc_physical(0, 2 * CHUNK, false).unwrap().unwrap();
    let (v1, v2) = (
        a.f.reserve(2 * CHUNK).unwrap(),
        a.f.reserve(2 * CHUNK).unwrap(),
    );
    assert_eq!(a.r.map(v1, 2 * CHUNK, 0, h), Some(Ok(())));
    assert_eq!(a.r.map(v2, 2 * CHUNK, 0, h), Some(Ok(())));
    // whole handles only, at offset 0, never over a mapping
    assert_eq!(a.r.map(v1, CHUNK, 0, h), Some(Err(AclError::INVALID_PARAM)));
    let p = pattern(5, 2 * CHUNK);
    a.write(v1, &p);
    assert_eq!(a.read(v2, 2 * CHUNK), p);
    // pressure: the handle's chunks leave HBM and come back at both VAs
    let other = a.malloc(2 * CHUNK);
    a.write(other, &pattern(6, 2 * CHUNK));
    assert!(a.r.counters().evictions >= 2);
    let q = pattern(7, 4096);
    a.write(v2 + CHUNK + 8, &q);
    let mut want = p.clone();
    want[CHUNK as usize + 8..CHUNK as usize + 8 + 4096].copy_from_slice(&q);
    assert_eq!(a.read(v1, 2 * CHUNK), want);
    // a mapped handle cannot be freed
    assert_eq!(a.r.free_physical(h), Some(Err(AclError::RT_MEMORY_FREE)));
    assert_eq!(a.r.unmap(v1), Some(Ok(())));
    assert_eq!(
        a.read(v2, 2 * CHUNK),
        want,
        "still there through the other VA"
    );
    // unmapped everywhere: its data stays with the handle
    assert_eq!(a.r.unmap(v2), Some(Ok(())));
    a.read(other, 2 * CHUNK);
    assert_eq!(a.r.map(v1, 2 * CHUNK, 0, h), Some(Ok(())));
    assert_eq!(a.read(v1, 2 * CHUNK), want, "mapped again");
    assert_eq!(a.r.unmap(v1), Some(Ok(())));
    assert_eq!(a.r.free_physical(h), Some(Ok(())));
    a.f.release(v1).unwrap();
    a.f.release(v2).unwrap();
    a.free(other);
    assert_eq!(a.f.held().0, 0);
    a.assert_clean();
}

/// The VA entry `prepare` keeps across calls (`State::last_va`) is
/// forgotten when the VA is unmapped and mapped to another handle: the next
/// call at that VA uses the new handle's chunks, the old keeps its bytes.
#[test]
fn a_va_mapped_to_another_handle_is_not_served_from_the_kept_entry() {
    let a = App::new(4, &[]);
    let h1 = a.r.malloc_physical(0, CHUNK, false).unwrap().unwrap();
    let h2 = a.r.malloc_physical(0, CHUNK, false).unwrap().unwrap();
    let (v, w) = (a.f.reserve(CHUNK).unwrap(), a.f.reserve(CHUNK).unwrap());
    assert_eq!(a.r.map(v, CHUNK, 0, h1), Some(Ok(())));
    let (p1, p2) = (pattern(11, CHUNK), pattern(12, CHUNK));
    // the last call's range is at v, in h1
    a.write(v, &p1);
    assert_eq!(a.r.unmap(v), Some(Ok(())));
    assert_eq!(a.r.map(v, CHUNK, 0, h2), Some(Ok(())));
    let q = pattern(13, 4096);
    a.write(v + 64, &q);
    a.write(v, &p2);
    assert_eq!(a.read(v, CHUNK), p2, "h2 at v");
    assert_eq!(a.r.map(w, CHUNK, 0, h1), Some(Ok(())));
    assert_eq!(a.read(w, CHUNK), p1, "h1 kept its bytes");
    assert_eq!(a.r.unmap(v), Some(Ok(())));
    assert_eq!(a.r.unmap(w), Some(Ok(())));
    assert_eq!(a.r.free_physical(h1), Some(Ok(())));
    assert_eq!(a.r.free_physical(h2), Some(Ok(())));
    a.f.release(v).unwrap();
    a.f.release(w).unwrap();
    assert_eq!(a.f.held().0, 0);
    a.assert_clean();
}

#[test]
fn free_waits_for_u3ms_own_copies_and_gives_everything_back() {
    let a = App::new(4, &[]);
    let x = a.malloc(2 * CHUNK);
    let y = a.malloc(4 * CHUNK);
    a.write(x, &pattern(1, 2 * CHUNK));
    a.write(y, &pattern(2, 4 * CHUNK)); // x to DRAM
    a.free(y);
    // the prefetch queues x's copy-ins on u3m's stream (lazy: not run yet)
    let mut issued = 0;
    for _ in 0..3 {
        issued += a.r.prefetch(0, 64 * MIB, 1.0, 1000);
    }
    assert_eq!(issued, 2, "x predicted and brought back");
    // freeing x now must not let those copies land in unmapped memory
    a.free(x);
    a.f.drain();
    a.assert_clean();
    assert_eq!(a.f.held().0, 0, "physical chunks given back");
    assert_eq!(a.r.usage(0), (0, 0, 0), "nothing resident, no host copies");
    assert!(!a.r.active());
}

#[test]
fn an_eviction_waits_for_the_use_still_in_flight() {
    let a = App::new(1, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    let s = a.f.app_stream();
    // queued, not run: x is in use until the stream gets to it
    a.op(s, &[(x, CHUNK)], &[(x, CHUNK)], add(x, x, CHUNK, 7));
    // y needs x's chunk of HBM: the eviction must wait for the operator
    a.write(y, &pattern(2, CHUNK));
    let want: Vec<u8> = pattern(1, CHUNK)
        .iter()
        .map(|b| b.wrapping_add(7))
        .collect();
    assert_eq!(a.read(x, CHUNK), want);
    assert_eq!(a.read(y, CHUNK), pattern(2, CHUNK));
    a.assert_clean();
}

/// A use an eviction's scan has seen complete is not asked about again:
/// chunks used by finished work on one stream and by queued work on
/// another stay busy through many evictions; each scan past them asked
/// the runtime about the finished work again (11 answers over 11
/// evictions here, 3 now; the 8-layer LoRA at 1.5 x HBM: 69 queries per
/// eviction before, 54 after).
#[test]
fn an_eviction_asks_about_a_finished_use_once() {
    let a = App::new(4, &[]);
    let busy: Vec<u64> = (0..3).map(|_| a.malloc(CHUNK)).collect();
    for (k, &va) in busy.iter().enumerate() {
        a.write(va, &pattern(k as u64, CHUNK));
    }
    let ins: Vec<(u64, u64)> = busy.iter().map(|&va| (va, CHUNK)).collect();
    // read by a call on s1 that runs, then by one on s2 that stays queued
    // (lazy streams): each chunk's uses are s1's fence, done, and s2's
    let (s1, s2) = (a.f.app_stream(), a.f.app_stream());
    a.op(s1, &ins, &[], add(busy[0], busy[0], 0, 0));
    a.f.drain();
    a.op(s2, &ins, &[], add(busy[1], busy[1], 0, 0));
    // twelve one-chunk buffers through the one free chunk of HBM: each
    // eviction's scan meets the three busy chunks first (least recently
    // used) and takes the buffer behind them
    let evictions = a.r.counters().evictions;
    let before = a.f.seen().done_answers;
    for k in 0..12 {
        a.write(a.malloc(CHUNK), &pattern(100 + k, CHUNK));
    }
    let evicted = a.r.counters().evictions - evictions;
    assert!(evicted >= 10, "{evicted} evictions");
    let s = a.f.seen();
    // s1's fence, done before the loop: one answer per chunk naming it
    let asked =
        s.done_answers.get(&s1).copied().unwrap_or(0) - before.get(&s1).copied().unwrap_or(0);
    assert!(
        asked <= 3,
        "s1's finished work asked about {asked} times over {evicted} evictions"
    );
    a.f.drain();
    for (k, &va) in busy.iter().enumerate() {
        assert_eq!(a.read(va, CHUNK), pattern(k as u64, CHUNK));
    }
    a.assert_clean();
}

/// Starts the eviction of the chunk at `va` as the demand path does: a
/// dirty chunk's copy-out is issued on u3m's device-to-host stream and the
/// call returns without waiting for it.
fn start_eviction(a: &App, va: u64) -> (u64, u32) {
    let mut st = a.r.shard_of(0).st.lock().unwrap();
    let (id, i) = st.resolve(va).expect("managed");
    a.r.shard_of(0).evict(&mut st, id, i).expect("evict");
    (id, i)
}

#[test]
fn a_chunk_still_in_use_is_never_evicted_directly() {
    let a = App::new(2, &[]);
    let (x, y) = (a.malloc(CHUNK), a.malloc(CHUNK));
    a.write(x, &pattern(1, CHUNK));
    a.write(y, &pattern(2, CHUNK));
    // y clean: copied out (landed) and read back, its host copy current
    start_eviction(&a, y);
    a.f.drain();
    {
        let mut st = a.r.shard_of(0).st.lock().unwrap();
        a.r.shard_of(0).harvest(&mut st, 0, usize::MAX);
    }
    assert_eq!(a.read(y, CHUNK), pattern(2, CHUNK));
    let s = a.f.app_stream();
    // queued, not run (lazy stream): x is written and y read when it runs
    a.op(s, &[(y, CHUNK)], &[(x, CHUNK)], add(y, x, CHUNK, 5));
    let d2h = a.f.seen().d2h;
    for va in [y, x] {
        let sh = a.r.shard_of(0);
        let mut st = sh.st.lock().unwrap();
        let (id, i) = st.resolve(va).expect("managed");
        assert!(
            matches!(sh.evict(&mut st, id, i), Err(Fail::Busy)),
            "{va:#x} is in use"
        );
        assert!(st.wait_for.take().is_some(), "the use to wait for is named");
        assert!(st.chunk(id, i).in_hbm() && st.chunk(id, i).out_ev == 0);
    }
    assert_eq!(a.f.seen().d2h, d2h, "no copy-out issued");
    // once the operator ran, both go (x with a copy-out, y dropped)
    a.f.drain();
    let c = a.r.counters();
    start_eviction(&a, x);
    start_eviction(&a, y);
    assert_eq!(
        a.r.counters().clean_drops,
        c.clean_drops + 1,
        "y was the clean one"
    );
    assert_eq!(a.f.seen().d2h, d2h + 1, "x's copy-out");
    let want: Vec<u8> = pattern(2, CHUNK)
        .iter()
        .map(|b| b.wrapping_add(5))
        .collect();
    assert_eq!(a.read(x, CHUNK), want);
    assert_eq!(a.read(y, CHUNK), pattern(2, CHUNK));
    a.assert_clean();
}

#[test]
fn a_dirty_chunks_hbm_is_freed_only_after_its_copy_out_lands() {
    let a = App::new(2, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    a.write(y, &pattern(2, CHUNK));
    let (held, d2h) = (a.f.held().0, a.f.seen().d2h);
    let (id, i) = start_eviction(&a, x);
    {
        let mut st = a.r.shard_of(0).st.lock().unwrap();
        // the device has not run the copy (lazy stream): nothing completes
        a.r.shard_of(0).harvest(&mut st, 0, usize::MAX);
        assert_ne!(st.chunk(id, i).phys, 0, "x still in HBM, mapped");
        assert_ne!(st.chunk(id, i).out_ev, 0, "x is leaving");
    }
    assert_eq!(
        a.f.seen().d2h,
        d2h + 1,
        "the copy-out is issued (and not run)"
    );
    assert_eq!(
        a.f.held().0,
        held,
        "x's HBM is held while its copy is in flight"
    );
    assert_eq!(a.r.counters().evictions, 0);
    // z needs x's HBM: its fault-in waits (without the lock) for the copy
    let z = a.malloc(CHUNK);
    a.write(z, &pattern(3, CHUNK));
    let c = a.r.counters();
    assert_eq!((c.evictions, c.to_dram, c.clean_drops), (1, 1, 0), "{c:?}");
    assert_eq!(a.read(x, CHUNK), pattern(1, CHUNK));
    assert_eq!(a.read(y, CHUNK), pattern(2, CHUNK));
    assert_eq!(a.read(z, CHUNK), pattern(3, CHUNK));
    a.assert_clean();
}

#[test]
fn a_chunk_needed_during_its_copy_out_stays_in_hbm() {
    let a = App::new(2, &[]);
    let x = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    start_eviction(&a, x);
    let faults = a.r.counters().faults_in;
    // an operator on the program's stream needs x before the copy ran
    let s = a.f.app_stream();
    a.op(s, &[(x, CHUNK)], &[(x, CHUNK)], add(x, x, CHUNK, 5));
    let c = a.r.counters();
    assert_eq!(c.faults_in, faults, "x never left");
    assert_eq!(c.rescued, 1);
    // both streams run; the landed copy is stale and only gives its slot back
    a.f.drain();
    {
        let mut st = a.r.shard_of(0).st.lock().unwrap();
        a.r.shard_of(0).harvest(&mut st, 0, usize::MAX);
        assert!(st.devs[0].outgoing.is_empty());
    }
    assert_eq!(a.r.usage(0), (CHUNK, 0, 0), "resident, no DRAM copy");
    let want: Vec<u8> = pattern(1, CHUNK)
        .iter()
        .map(|b| b.wrapping_add(5))
        .collect();
    assert_eq!(a.read(x, CHUNK), want);
    assert_eq!(a.r.counters().evictions, 0);
    a.assert_clean();
}

#[test]
fn copy_outs_run_ahead_for_the_chunks_a_call_still_needs() {
    // 4 dirty chunks fill HBM; a call needing 3 others starts their
    // victims' copy-outs together (one per chunk still needed), not 1 by 1
    let a = App::new(4, &[]);
    let x = a.malloc(4 * CHUNK);
    a.write(x, &pattern(1, 4 * CHUNK));
    let y = a.malloc(3 * CHUNK);
    let s = a.f.app_stream();
    a.op(s, &[(y, 3 * CHUNK)], &[], Box::new(|_m: &mut Mem<'_>| {}));
    let c = a.r.counters();
    assert_eq!(
        c.evictions + a.r.shard_of(0).st.lock().unwrap().devs[0].outgoing.len() as u64,
        3,
        "{c:?}"
    );
    a.f.drain();
    assert_eq!(a.read(x, 4 * CHUNK), pattern(1, 4 * CHUNK));
    a.assert_clean();
}

#[test]
fn a_call_on_another_stream_runs_after_its_copy_in() {
    let a = App::new(2, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    let z = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    a.write(y, &pattern(2, CHUNK));
    a.write(z, &pattern(3, CHUNK)); // x to DRAM
    let s = a.f.app_stream();
    // x comes back on u3m's stream; the operator must see its bytes
    a.op(s, &[(x, CHUNK)], &[(y, CHUNK)], add(x, y, CHUNK, 1));
    // the program synchronises its own stream only
    a.f.sync_stream(s).unwrap();
    let want: Vec<u8> = pattern(1, CHUNK)
        .iter()
        .map(|b| b.wrapping_add(1))
        .collect();
    assert_eq!(a.read(y, CHUNK), want);
    a.assert_clean();
}

#[test]
fn a_call_waits_for_a_prefetch_still_in_flight() {
    let a = App::new(2, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(2 * CHUNK);
    a.write(x, &pattern(1, CHUNK));
    a.write(y, &pattern(2, 2 * CHUNK)); // x to DRAM
    a.free(y);
    let z = a.malloc(CHUNK);
    a.write(z, &pattern(3, CHUNK));
    // x's copy-in is queued on u3m's stream, not run
    let issued: u32 = (0..3).map(|_| a.r.prefetch(0, 64 * MIB, 1.0, 1000)).sum();
    assert_eq!(issued, 1);
    let faults = a.r.counters().faults_in;
    let s = a.f.app_stream();
    a.op(s, &[(x, CHUNK)], &[(z, CHUNK)], add(x, z, CHUNK, 3));
    assert_eq!(a.r.counters().faults_in, faults, "x and z were resident");
    assert_eq!(
        a.r.counters().prefetch_hits,
        1,
        "x was prefetched, then used"
    );
    a.f.sync_stream(s).unwrap();
    let want: Vec<u8> = pattern(1, CHUNK)
        .iter()
        .map(|b| b.wrapping_add(3))
        .collect();
    assert_eq!(a.read(z, CHUNK), want);
    a.assert_clean();
}

#[test]
fn a_lost_device_keeps_what_dram_holds_readable() {
    let a = App::new(2, &[]);
    let x = a.malloc(2 * CHUNK);
    let y = a.malloc(2 * CHUNK);
    let px = pattern(1, 2 * CHUNK);
    a.write(x, &px);
    a.write(y, &pattern(2, 2 * CHUNK)); // x only in DRAM, y only in HBM
    a.f.lose();
    let (lost, kept) = a.r.device_lost(0).expect("first report");
    assert_eq!(lost, vec![(y, 2 * CHUNK)]);
    assert_eq!(kept, vec![(x, 2 * CHUNK)]);
    assert!(a.r.device_lost(0).is_none(), "reported once");
    assert!(a.r.any_lost());
    let mut buf = vec![0u8; 3 * MIB as usize];
    let r = unsafe { a.r.read_lost(x + MIB, buf.as_mut_ptr(), 3 * MIB) };
    assert_eq!(r, Some(Ok(())));
    assert_eq!(&buf[..], &px[MIB as usize..4 * MIB as usize]);
    let r = unsafe { a.r.read_lost(y, buf.as_mut_ptr(), MIB) };
    assert_eq!(r, Some(Err(E_DEVICE_LOST)));
    // nothing runs on the lost device
    let rs = [Range {
        addr: x,
        len: 8,
        write: false,
        whole: false,
    }];
    assert_eq!(
        a.r.prepare(0, 0, &rs, false, Order::Host).err(),
        Some(E_DEVICE_LOST)
    );
    // unmanaged memory is not the manager's to serve
    assert_eq!(unsafe { a.r.read_lost(0x1234, buf.as_mut_ptr(), 8) }, None);
    a.assert_clean();
}

/// U3M_HANDOFF=on: the program frees a chunk whose HBM went to another
/// chunk before u3m harvested its copy-out, and that other chunk, in either
/// order: the old mapping goes before the memory (no misuse), and the
/// memory is given back once. (Each copy has run: the program's own work
/// on both is complete before it frees them, as it must be.)
#[test]
fn freeing_both_owners_of_handed_on_hbm_gives_it_back_once() {
    for first in ["old", "new"] {
        let (a, [x, y, z, w], s) = handed_on();
        // the program waits for its work (x's copy-out and w's copy-in run
        // before it: it waits on them), then frees; u3m has not harvested
        a.f.sync_stream(s).unwrap();
        let order = if first == "old" { [x, w] } else { [w, x] };
        for va in order {
            a.free(va);
        }
        a.f.drain();
        let zp = pattern(3, CHUNK);
        assert_eq!(a.read(z, CHUNK), zp, "{first}");
        assert_eq!(
            a.read(y, CHUNK),
            zp.iter().map(|b| b.wrapping_add(1)).collect::<Vec<_>>(),
            "{first}"
        );
        a.free(y);
        a.free(z);
        a.f.drain();
        assert_eq!(a.f.held().0, 0, "{first}: every physical chunk given back");
        a.assert_clean();
    }
}

/// U3M_HANDOFF=on and the device lost with copies queued: a chunk whose
/// HBM went to another chunk's copy-in before its copy-out ran had its only
/// data there, so it is reported lost and refused to a read, never served
/// as zeros; a chunk whose host copy is current stays readable.
#[test]
fn a_lost_device_loses_a_chunk_whose_hbm_was_handed_on_before_its_copy_ran() {
    let (a, [x, y, z, w], _) = handed_on();
    a.f.lose();
    let (mut lost, kept) = a.r.device_lost(0).expect("first report");
    lost.sort();
    let mut want = vec![(x, CHUNK), (y, CHUNK), (z, CHUNK)];
    want.sort();
    assert_eq!(lost, want, "x's data was only in the HBM w took");
    assert_eq!(kept, vec![(w, CHUNK)]);
    let mut buf = vec![0u8; CHUNK as usize];
    let r = unsafe { a.r.read_lost(x, buf.as_mut_ptr(), CHUNK) };
    assert_eq!(r, Some(Err(E_DEVICE_LOST)));
    let r = unsafe { a.r.read_lost(w, buf.as_mut_ptr(), CHUNK) };
    assert_eq!(r, Some(Ok(())));
    assert_eq!(buf, pattern(4, CHUNK));
}

#[test]
fn an_exported_handle_becomes_real_keeps_its_data_and_never_moves() {
    let a = App::new(5, &[]);
    // one chunk: made resident, its chunk exported
    let h1 = a.r.malloc_physical(0, CHUNK, false).unwrap().unwrap();
    let v1 = a.f.reserve(CHUNK).unwrap();
    assert_eq!(a.r.map(v1, CHUNK, 0, h1), Some(Ok(())));
    a.write(v1, &pattern(1, CHUNK));
    // two chunks that get evicted first: replaced by one real handle
    let h2 = a.r.malloc_physical(0, 2 * CHUNK, false).unwrap().unwrap();
    let v2 = a.f.reserve(2 * CHUNK).unwrap();
    assert_eq!(a.r.map(v2, 2 * CHUNK, 0, h2), Some(Ok(())));
    a.write(v2, &pattern(2, 2 * CHUNK));
    let x = a.malloc(2 * CHUNK);
    let y = a.malloc(2 * CHUNK);
    a.write(x, &pattern(3, 2 * CHUNK));
    a.write(y, &pattern(4, 2 * CHUNK));
    assert!(a.r.counters().evictions >= 1);
    let real1 = a.r.export(h1).unwrap().unwrap();
    let real2 = a.r.export(h2).unwrap().unwrap();
    assert_ne!(real1, h1);
    assert_ne!(real2, h2);
    assert_eq!(a.r.export(h2), Some(Ok(real2)), "made real once");
    assert_eq!(a.read(v1, CHUNK), pattern(1, CHUNK));
    assert_eq!(a.read(v2, 2 * CHUNK), pattern(2, 2 * CHUNK));
    // under pressure only the unpinned allocations move
    for k in 0..3 {
        assert_eq!(a.read(x, 2 * CHUNK), pattern(3, 2 * CHUNK), "round {k}");
        assert_eq!(a.read(y, 2 * CHUNK), pattern(4, 2 * CHUNK), "round {k}");
        let faults = a.r.counters().faults_in;
        assert_eq!(a.read(v2, 2 * CHUNK), pattern(2, 2 * CHUNK), "round {k}");
        assert_eq!(a.read(v1, CHUNK), pattern(1, CHUNK));
        assert_eq!(a.r.counters().faults_in, faults, "the exported stay");
    }
    assert_eq!(a.r.unmap(v1), Some(Ok(())));
    assert_eq!(a.r.unmap(v2), Some(Ok(())));
    assert_eq!(a.r.free_physical(h1), Some(Ok(())));
    assert_eq!(a.r.free_physical(h2), Some(Ok(())));
    a.free(x);
    a.free(y);
    a.f.release(v1).unwrap();
    a.f.release(v2).unwrap();
    assert_eq!(a.f.held().0, 0);
    a.assert_clean();
}

/// Random programs: allocations owned by one of two streams, operators,
/// synchronous reads and writes, frees and new allocations, the device
/// sometimes catching up — against a model of what every byte must be.
#[test]
fn random_programs_never_touch_unmapped_memory_and_lose_nothing() {
    for seed in 1..=6u64 {
        let a = App::new(6, &[]);
        let streams = [a.f.app_stream(), a.f.app_stream()];
        let mut rng = pattern(seed, 4096).into_iter().cycle();
        let mut next = move |n: u64| -> u64 {
            let v = (rng.next().unwrap() as u64) << 8 | rng.next().unwrap() as u64;
            v % n
        };
        // (va, bytes, owning stream, model)
        let mut live: Vec<(u64, u64, usize, Vec<u8>)> = Vec::new();
        for step in 0..160 {
            match next(10) {
                0 | 1 if live.len() < 7 => {
                    let bytes = (1 + next(5)) * MIB + next(3) * 4096;
                    let va = a.malloc(bytes);
                    let p = pattern(seed * 1000 + step, bytes);
                    a.write(va, &p);
                    live.push((va, bytes, next(2) as usize, p));
                }
                2 if live.len() > 2 => {
                    let k = next(live.len() as u64) as usize;
                    let (va, _, s, _) = live.swap_remove(k);
                    a.f.sync_stream(streams[s]).unwrap();
                    a.free(va);
                }
                3 => a.f.drain(),
                4 | 5 if !live.is_empty() => {
                    // a synchronous read of part of an allocation
                    let k = next(live.len() as u64) as usize;
                    let (va, bytes, s, ref m) = live[k];
                    let off = next(bytes);
                    let len = 1 + next(bytes - off);
                    a.f.sync_stream(streams[s]).unwrap();
                    assert_eq!(
                        a.read(va + off, len),
                        m[off as usize..(off + len) as usize],
                        "seed {seed} step {step}"
                    );
                }
                _ if live.len() >= 2 => {
                    // an operator on the owner's stream: dst = src + 1 over
                    // a span both have
                    let i = next(live.len() as u64) as usize;
                    let s = live[i].2;
                    let same: Vec<usize> = (0..live.len()).filter(|&j| live[j].2 == s).collect();
                    let j = same[next(same.len() as u64) as usize];
                    let len = 1 + next(live[i].1.min(live[j].1));
                    let (src, dst) = (live[i].0, live[j].0);
                    a.op(
                        streams[s],
                        &[(src, len)],
                        &[(dst, len)],
                        add(src, dst, len, 1),
                    );
                    let v: Vec<u8> = live[i].3[..len as usize]
                        .iter()
                        .map(|b| b.wrapping_add(1))
                        .collect();
                    live[j].3[..len as usize].copy_from_slice(&v);
                }
                _ => {}
            }
        }
        for s in streams {
            a.f.sync_stream(s).unwrap();
        }
        for (va, bytes, _, m) in &live {
            assert_eq!(&a.read(*va, *bytes), m, "seed {seed} final");
        }
        a.assert_clean();
        assert!(a.r.counters().evictions > 0, "seed {seed}: no pressure");
    }
}

/// LRU that counts how often it orders the eviction candidates.
struct CountingLru {
    lru: crate::policy::Lru,
    orders: &'static std::sync::atomic::AtomicU64,
}

impl crate::policy::Placement for CountingLru {
    fn name(&self) -> &'static str {
        "counting-lru"
    }
    fn on_access(&self, now: u64, class: u8, keys: &[u64], writes: &[Touch]) {
        self.lru.on_access(now, class, keys, writes)
    }
    fn on_free(&self, key: u64) {
        self.lru.on_free(key)
    }
    fn order(&self, now: u64, cands: &mut [crate::policy::Cand]) {
        self.orders
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lru.order(now, cands)
    }
    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        self.lru.predicts(now, key, w)
    }
}

#[test]
fn evictions_take_victims_from_a_kept_order_not_a_sort_each() {
    static ORDERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let a = App::with_policy(
        256,
        Box::new(CountingLru {
            lru: crate::policy::Lru::new(),
            orders: &ORDERS,
        }),
    );
    // 320 one-chunk allocations on a 256-chunk device, read in a cycle by
    // calls that each touch 32 of them
    let vas: Vec<u64> = (0..320).map(|_| a.malloc(CHUNK)).collect();
    for (k, &va) in vas.iter().enumerate() {
        a.write(va, &pattern(k as u64, 64));
    }
    for _ in 0..3 {
        for group in vas.chunks(32) {
            let rs: Vec<Range> = group
                .iter()
                .map(|&addr| Range {
                    addr,
                    len: 64,
                    write: false,
                    whole: false,
                })
                .collect();
            a.sync(&rs, false, || Ok(())).expect("call");
        }
        for (k, &va) in vas.iter().enumerate().step_by(37) {
            assert_eq!(a.read(va, 64), pattern(k as u64, 64));
        }
    }
    let c = a.r.counters();
    let orders = ORDERS.load(std::sync::atomic::Ordering::Relaxed);
    assert!(c.evictions >= 500, "{c:?}");
    // a sort per eviction would be one per eviction; a kept order is
    // rebuilt every REBUILD_TAKEN evictions or the policy's order_ttl calls
    assert!(
        orders * 16 <= c.evictions,
        "{orders} sorts for {} evictions",
        c.evictions
    );
    a.assert_clean();
}

/// A call larger than HBM (issue 11): with host mapping it runs, part of
/// its chunks in host handles at their VAs, and computes the right bytes;
/// the chunks come back into HBM for a later call that fits; with host
/// mapping off it is refused before anything runs.
#[test]
fn a_call_larger_than_hbm_runs_host_mapped_or_is_refused() {
    for host_map in ["auto", "off"] {
        // 10 + 10 MiB touched at once on an 8-chunk (16 MiB) device
        let a = App::new(8, &[("U3M_HOST_MAP", host_map)]);
        let (x, y) = (a.malloc(10 * MIB), a.malloc(10 * MIB));
        let px = pattern(1, 10 * MIB);
        a.write(x, &px);
        a.write(y, &pattern(2, 10 * MIB));
        let s = a.f.app_stream();
        let rc = a.try_op(
            s,
            &[(x, 10 * MIB)],
            &[(y, 10 * MIB)],
            add(x, y, 10 * MIB, 1),
        );
        let c = a.r.counters();
        if host_map == "auto" {
            assert_eq!(rc, Ok(()));
            assert!(c.host_maps > 0, "{c:?}");
            assert!(a.f.seen().host_handles > 0);
            assert_eq!(c.refused_oversize, 0);
        } else {
            assert_eq!(rc, Err(E_ALLOC));
            assert_eq!(c.refused_oversize, 1, "{c:?}");
            assert_eq!(c.host_maps, 0);
            assert!(a.r.take_oversize().is_some());
        }
        a.f.drain();
        // each read fits: host-mapped chunks come back into HBM
        assert_eq!(a.read(x, 10 * MIB), px, "{host_map}: x intact");
        let want: Vec<u8> = if host_map == "auto" {
            px.iter().map(|b| b.wrapping_add(1)).collect()
        } else {
            pattern(2, 10 * MIB)
        };
        assert_eq!(a.read(y, 10 * MIB), want, "{host_map}: y");
        if host_map == "auto" {
            assert!(a.r.counters().host_unmaps > 0);
        }
        a.free(x);
        a.free(y);
        assert_eq!(a.f.seen().host_handles, 0, "host handles freed");
        assert_eq!(a.r.host_mapped(0), 0);
        a.assert_clean();
    }
}

/// Two devices: u3m synchronises a stream only from its own device (the
/// runtime refuses a stream of another device). Before, reclaiming host
/// slots and aclFinalize synchronised every device's stream from the
/// calling thread's device: the other device's copies were not waited for
/// and their DRAM slots were given back under them.
#[test]
fn streams_are_synchronised_on_their_own_device() {
    let f = Fake::leak(2, CHUNK);
    let r = Residency::new(f, &config(&[])).expect("residency");
    let step = |dev: u32, va: u64, data: Option<&[u8]>| -> Vec<u8> {
        f.set_device(dev).unwrap();
        sync_call(&r, f, dev, va, CHUNK, data).expect("call")
    };
    let mut vas = Vec::new();
    for dev in 0..2u32 {
        f.set_device(dev).unwrap();
        let (free, total) = f.mem_info().unwrap();
        let x = r.malloc(dev, CHUNK, free, total).unwrap().unwrap();
        let y = r.malloc(dev, CHUNK, free, total).unwrap().unwrap();
        step(dev, x, Some(&pattern(dev as u64, CHUNK)));
        step(dev, y, Some(&pattern(10 + dev as u64, CHUNK))); // x copied out
        assert_eq!(step(dev, x, None), pattern(dev as u64, CHUNK)); // y out, x in
                                                                    // x's clean DRAM copy goes stale: its slot waits for device `dev`'s
                                                                    // stream (device 1's evictions below reclaim slots: never by
                                                                    // synchronising device 0's stream from device 1)
        step(dev, x, Some(&pattern(20 + dev as u64, CHUNK)));
        vas.push((x, y));
    }
    for (dev, &(x, y)) in vas.iter().enumerate() {
        let dev = dev as u32;
        assert_eq!(step(dev, y, None), pattern(10 + dev as u64, CHUNK));
        assert_eq!(step(dev, x, None), pattern(20 + dev as u64, CHUNK));
    }
    // device 1 is current; u3m's streams of device 0 hold its last copies
    r.finalize();
    f.drain();
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
}

/// Records of use fences on the program's stream `s`.
fn records_on(a: &App, s: u64) -> u64 {
    a.f.seen().records.get(&s).copied().unwrap_or(0)
}

/// Use fences (fence.rs): calls on a stream share one fence, recorded only
/// when an eviction asks. Both chunks' operators are queued, not run, when
/// a third chunk needs their HBM: the eviction must wait for the fence,
/// which must be recorded *after* both operators. Fails if the fence is
/// queried unrecorded (the fake reports an unrecorded event complete: the
/// chunk is unmapped under the queued operator, an MMU fault) or recorded
/// before the second call.
#[test]
fn an_eviction_waits_for_every_call_a_shared_fence_covers() {
    let a = App::new(2, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    let z = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    a.write(y, &pattern(2, CHUNK));
    let s = a.f.app_stream();
    a.op(s, &[(x, CHUNK)], &[(x, CHUNK)], add(x, x, CHUNK, 7));
    a.op(s, &[(y, CHUNK)], &[(y, CHUNK)], add(y, y, CHUNK, 3));
    assert_eq!(records_on(&a, s), 0, "no event per call");
    // z needs HBM that x or y hold: waits for the stream
    a.write(z, &pattern(3, CHUNK));
    assert_eq!(records_on(&a, s), 1, "one fence for both calls");
    let plus = |seed, k: u8| -> Vec<u8> {
        pattern(seed, CHUNK)
            .iter()
            .map(|b| b.wrapping_add(k))
            .collect()
    };
    for (va, want, n) in [(x, plus(1, 7), "x"), (y, plus(2, 3), "y")] {
        let got = a.read(va, CHUNK);
        assert!(
            got == want,
            "{n}: {:?} want {:?}, faults {:?}",
            &got[..8],
            &want[..8],
            a.f.seen().faults
        );
    }
    // a new round: the next call names a new fence (not the recorded one,
    // which is complete), and the evictions x and y force wait for it
    a.op(s, &[(z, CHUNK)], &[(z, CHUNK)], add(z, z, CHUNK, 5));
    a.write(x, &pattern(4, CHUNK));
    a.write(y, &pattern(5, CHUNK));
    a.f.drain(); // the program synchronises the stream before reading z
    for (va, want, n) in [
        (z, plus(3, 5), "z"),
        (x, pattern(4, CHUNK), "x"),
        (y, pattern(5, CHUNK), "y"),
    ] {
        let got = a.read(va, CHUNK);
        assert!(
            got == want,
            "{n}: {:?} want {:?}, faults {:?}",
            &got[..8],
            &want[..8],
            a.f.seen().faults
        );
    }
    assert_eq!(records_on(&a, s), 2);
    a.assert_clean();
}

/// Many calls on one stream with nothing to evict: the fence is recorded
/// once per `FENCE_CALLS` calls (by the call that fills it), not per call;
/// before capture begins on the stream its open fence is recorded, and an
/// eviction afterwards records nothing more there. Fails with an event per
/// call (100 records) or if a capture can find an open fence on its stream.
#[test]
fn fences_are_recorded_once_per_round_and_before_capture() {
    let a = App::new(1, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    let s = a.f.app_stream();
    for _ in 0..100 {
        a.op(s, &[(x, CHUNK)], &[(x, CHUNK)], add(x, x, CHUNK, 1));
    }
    let full = 100 / super::fence::FENCE_CALLS as u64;
    assert_eq!(records_on(&a, s), full);
    a.r.before_capture(s);
    assert_eq!(records_on(&a, s), full + 1, "the open fence, recorded");
    a.r.before_capture(s);
    assert_eq!(records_on(&a, s), full + 1, "nothing open any more");
    // (capture would begin here) y evicts x: waits for the recorded fence
    a.write(y, &pattern(2, CHUNK));
    assert_eq!(
        records_on(&a, s),
        full + 1,
        "no record on the capturing stream"
    );
    let want: Vec<u8> = pattern(1, CHUNK)
        .iter()
        .map(|b| b.wrapping_add(100))
        .collect();
    assert_eq!(a.read(x, CHUNK), want);
    assert_eq!(a.read(y, CHUNK), pattern(2, CHUNK));
    a.assert_clean();
}

/// Calls on the default stream (0) each record their own event (no fence
/// shared under a name that differs per context), and an eviction still
/// waits for the last one.
#[test]
fn the_default_stream_records_an_event_per_call() {
    let a = App::new(1, &[]);
    let x = a.malloc(CHUNK);
    let y = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    for _ in 0..3 {
        a.op(0, &[(x, CHUNK)], &[(x, CHUNK)], add(x, x, CHUNK, 1));
    }
    assert_eq!(records_on(&a, 0), 3);
    a.write(y, &pattern(2, CHUNK)); // evicts x: waits for the stream
    let want: Vec<u8> = pattern(1, CHUNK)
        .iter()
        .map(|b| b.wrapping_add(3))
        .collect();
    let got = a.read(x, CHUNK);
    assert!(
        got == want,
        "x: {:?}, faults {:?}",
        &got[..8],
        a.f.seen().faults
    );
    a.assert_clean();
}

/// A policy that knows the future the test scripts: `at[key]` is the key's
/// next use (absolute tick); eviction order is furthest next use first.
struct Script {
    at: &'static Mutex<std::collections::HashMap<u64, u64>>,
    /// Demand eviction least recently used first (the script then steers
    /// only the look-ahead).
    lru: bool,
    /// What `upcoming` names, when not `at` (a script whose two answers
    /// disagree, as a predictor's may between access and eviction).
    listed: Option<&'static Mutex<std::collections::HashMap<u64, u64>>>,
    /// `order_ttl` (0: the order is built for every eviction).
    ttl: u64,
    /// `order_top` leaves only the first `k` (as the predictive policy
    /// may: the kept order is then not complete).
    top: bool,
    /// `plan_out`: the keys an outside schedule has out now.
    planned: Option<&'static Mutex<std::collections::HashSet<u64>>>,
}

impl Script {
    fn new() -> (Script, &'static Mutex<std::collections::HashMap<u64, u64>>) {
        let at = Box::leak(Box::new(Mutex::new(std::collections::HashMap::new())));
        (
            Script {
                at,
                lru: false,
                listed: None,
                ttl: 0,
                top: false,
                planned: None,
            },
            at,
        )
    }
}

impl crate::policy::Placement for Script {
    fn name(&self) -> &'static str {
        "script"
    }
    fn on_access(&self, _now: u64, _class: u8, _keys: &[u64], _writes: &[Touch]) {}
    fn order(&self, now: u64, cands: &mut [crate::policy::Cand]) {
        if self.lru {
            return crate::policy::Lru::new().order(now, cands);
        }
        cands.sort_by_key(|c| std::cmp::Reverse(self.next_use(now, c.key).unwrap_or(u64::MAX)));
    }
    fn order_ttl(&self) -> u64 {
        self.ttl
    }
    fn order_top(&self, now: u64, cands: &mut Vec<crate::policy::Cand>, k: usize) {
        self.order(now, cands);
        if self.top {
            cands.truncate(k);
        }
    }
    fn predicts(&self, _now: u64, _key: u64, _w: u64) -> bool {
        false
    }
    fn next_use(&self, now: u64, key: u64) -> Option<u64> {
        self.at
            .lock()
            .unwrap()
            .get(&key)
            .copied()
            .filter(|&t| t > now)
    }
    fn plan_out(&self, key: u64) -> bool {
        self.planned
            .is_some_and(|p| p.lock().unwrap().contains(&key))
    }
    fn upcoming(&self, now: u64, d: u64, out: &mut Vec<(u64, u64)>) {
        for (&k, &t) in self.listed.unwrap_or(self.at).lock().unwrap().iter() {
            if t > now && t <= now + d {
                out.push((t, k));
            }
        }
    }
}

/// Whether the chunk at `va` is in HBM.
fn resident(a: &App, va: u64) -> bool {
    let st = a.r.shard_of(0).st.lock().unwrap();
    let (id, i) = st.resolve(va).expect("managed");
    st.chunk(id, i).in_hbm()
}

/// A 3-chunk device with U3M_HANDOFF=on, a schedule's policy (`Script`:
/// `planned` the keys it has out, demand victims least recently used) and
/// four one-chunk allocations x, y, z, w, w and z written (in that order).
fn handoff_rig() -> (
    App,
    &'static Mutex<std::collections::HashSet<u64>>,
    [u64; 4],
) {
    let (mut policy, _at) = Script::new();
    policy.lru = true;
    let planned = Box::leak(Box::new(Mutex::new(std::collections::HashSet::new())));
    policy.planned = Some(planned);
    let a = App::with_policy_vars(3, Box::new(policy), &[("U3M_HANDOFF", "on")]);
    a.r.set_look_ahead(false);
    let v = [0; 4].map(|_| a.malloc(CHUNK));
    a.write(v[3], &pattern(4, CHUNK));
    a.write(v[2], &pattern(3, CHUNK));
    a.f.drain();
    (a, planned, v)
}

/// `handoff_rig`, then on the program's stream (lazy: nothing runs) x = z
/// and y = z + 1 queued (w leaves for them); the plan has x out, so x
/// leaves ordered after that operator; w comes back for an operator queued
/// behind it, into x's HBM (a hand-off) with x's copy-out still queued.
/// Returns the app, [x, y, z, w] and the program's stream.
fn handed_on() -> (App, [u64; 4], u64) {
    let (a, planned, v) = handoff_rig();
    let [x, y, z, w] = v;
    planned.lock().unwrap().insert(x);
    let s = a.f.app_stream();
    let k: Kernel = Box::new(move |m: &mut Mem<'_>| {
        let v = m.read(z, CHUNK);
        m.write(x, &v);
        m.write(y, &v.iter().map(|b| b.wrapping_add(1)).collect::<Vec<_>>());
    });
    a.op(s, &[(z, CHUNK)], &[(x, CHUNK), (y, CHUNK)], k);
    a.r.evict_planned(&[x]);
    assert_eq!(a.r.counters().ordered_outs, 1);
    let before = a.r.counters().handoffs;
    a.op(s, &[(w, CHUNK)], &[], Box::new(|_: &mut Mem<'_>| {}));
    assert_eq!(a.r.counters().handoffs, before + 1, "{:?}", a.r.counters());
    (a, v, s)
}

/// U3M_HANDOFF=on: a first touch reads as fresh memory (the runtime's:
/// zeros on the simulator and the fake), never as the bytes of a chunk
/// whose copy-out still reads the HBM it takes: u3m zeroes it on its
/// stream after that copy-out, or, for a call that writes it whole and
/// fails, gives it back (migrate.rs `fault_in_chunks`). acl_replay's
/// read-back on the simulator found it: an operator writing part of a new
/// chunk left another allocation's bytes in the rest.
#[test]
fn a_first_touch_with_copy_outs_in_flight_reads_as_fresh_memory() {
    let a = App::new(2, &[("U3M_HANDOFF", "on")]);
    let [x, y, z] = [0; 3].map(|_| a.malloc(CHUNK));
    a.write(x, &pattern(1, CHUNK));
    a.write(y, &pattern(2, CHUNK));
    let s = a.f.app_stream();
    let half = (CHUNK / 2) as usize;
    // half of z written (queued on the lazy stream): x or y leaves for it,
    // its copy-out not yet run
    let k: Kernel = Box::new(move |m: &mut Mem<'_>| m.write(z, &vec![9u8; half]));
    a.op(s, &[], &[(z, CHUNK / 2)], k);
    let c = a.r.counters();
    assert_eq!(
        (c.handoffs, c.zeroed),
        (1, 1),
        "z took a copy-out's HBM, zeroed: {c:?}"
    );
    a.f.sync_stream(s).unwrap();
    let mut fresh = vec![9u8; half];
    fresh.resize(2 * half, 0);
    assert_eq!(
        a.read(z, CHUNK),
        fresh,
        "z's unwritten half reads as fresh memory"
    );
    assert_eq!(a.read(x, CHUNK), pattern(1, CHUNK));
    assert_eq!(a.read(y, CHUNK), pattern(2, CHUNK));
    // a first touch written whole may take such HBM; if its call fails
    // (writing nothing), the chunk has no memory again and reads as fresh
    let w = a.malloc(CHUNK);
    a.write(x, &pattern(3, CHUNK));
    a.write(y, &pattern(4, CHUNK));
    let before = a.r.counters().handoffs;
    let rs = [Range {
        addr: w,
        len: CHUNK,
        write: true,
        whole: true,
    }];
    let tok =
        a.r.prepare(0, OpClass::Elementwise as u8, &rs, false, Order::Stream(s))
            .expect("prepared");
    assert_eq!(
        a.r.counters().handoffs,
        before + 1,
        "w took a copy-out's HBM"
    );
    a.r.finish(tok, Some(s), false);
    a.f.sync_stream(s).unwrap();
    assert_eq!(
        a.read(w, CHUNK),
        vec![0u8; CHUNK as usize],
        "the failed call wrote nothing"
    );
    assert_eq!(a.read(x, CHUNK), pattern(3, CHUNK));
    assert_eq!(a.read(y, CHUNK), pattern(4, CHUNK));
    for va in [x, y, z, w] {
        a.free(va);
    }
    a.f.drain();
    a.assert_clean();
}

/// U3M_PLAN (schedule.rs, planned.rs `follow_schedule`): after the call
/// an entry names, its chunk leaves HBM — ordered after the call on the
/// device with U3M_HANDOFF, once the call is complete without — and reads
/// back exactly. A chunk used again before it could leave stays. The
/// first entry whose chunk its call does not touch stops the schedule,
/// named; later entries are not followed. A malformed file stops the
/// manager's start, naming the line.
#[test]
fn the_library_follows_a_schedule_by_call_and_stops_at_one_not_its_own() {
    let dir = SwapDir::new("schedule");
    let path = dir.0.join("plan");
    // x, y, z: allocations 0, 1, 2 (calls: 1 writes x, 2 writes y, 3 is
    // z = x + 1 queued, 4 reads y, 5 and 6 queue reads of y, 7 reads z, 8 z)
    std::fs::write(
        &path,
        "# CALL ALLOC CHUNK\n3 0 0\n5 1 0\n7 0 0 # call 7 reads z only\n8 2 0\n",
    )
    .unwrap();
    let p = path.display().to_string();
    for handoff in ["off", "on"] {
        let a = App::new(3, &[("U3M_PLAN", p.as_str()), ("U3M_HANDOFF", handoff)]);
        a.r.set_look_ahead(false);
        let [x, y, z] = [0; 3].map(|_| a.malloc(CHUNK));
        a.write(x, &pattern(1, CHUNK));
        a.write(y, &pattern(2, CHUNK));
        let s = a.f.app_stream();
        let k: Kernel = Box::new(move |m: &mut Mem<'_>| {
            let v = m.read(x, CHUNK);
            m.write(z, &v.iter().map(|b| b.wrapping_add(1)).collect::<Vec<_>>());
        });
        a.op(s, &[(x, CHUNK)], &[(z, CHUNK)], k);
        assert_eq!(a.r.now(), 3);
        let c = a.r.counters();
        assert_eq!(c.schedule_entries, 1, "{c:?}");
        if handoff == "on" {
            // ordered after the queued operator on the device
            assert_eq!((c.planned_outs, c.ordered_outs), (1, 1), "{c:?}");
        } else {
            // its use is queued: it waits
            assert_eq!(c.planned_outs, 0, "{c:?}");
            assert!(resident(&a, x));
        }
        a.f.drain();
        assert_eq!(a.read(y, CHUNK), pattern(2, CHUNK));
        assert_eq!(a.r.counters().planned_outs, 1, "handoff {handoff}");
        {
            // gone, or its copy-out queued (harvested later)
            let st = a.r.shard_of(0).st.lock().unwrap();
            let (id, i) = st.resolve(x).expect("managed");
            let c = st.chunk(id, i);
            assert!(
                !c.in_hbm() || c.out_ev != 0,
                "handoff {handoff}: x out after call 3"
            );
        }
        // calls 5 and 6 queue reads of y; y is out after 5 but used by 6
        // before it could leave (without the hand-off: the use is queued)
        for _ in 0..2 {
            a.op(s, &[(y, CHUNK)], &[], Box::new(|_: &mut Mem<'_>| {}));
        }
        assert_eq!(a.r.now(), 6);
        a.f.drain();
        assert_eq!(
            a.read(z, CHUNK),
            pattern(1, CHUNK)
                .iter()
                .map(|b| b.wrapping_add(1))
                .collect::<Vec<_>>()
        );
        assert_eq!(a.r.now(), 7);
        let c = a.r.counters();
        if handoff == "off" {
            assert!(
                resident(&a, y),
                "used again by call 6: back in the plan's HBM"
            );
            assert_eq!(c.planned_outs, 1, "{c:?}");
        }
        // call 7 does not touch x: stopped there, named
        assert_eq!(c.schedule_stops, 1, "{c:?}");
        let why = a.r.schedule_stopped().expect("stopped");
        assert!(
            why.starts_with(&format!(
                "U3M_PLAN={p}:4: call 7 does not touch chunk 0 of allocation 0 on device 0"
            )),
            "{why}"
        );
        // entry 8 is not followed
        let before = a.r.counters();
        assert_eq!(a.read(z, CHUNK)[0], pattern(1, CHUNK)[0].wrapping_add(1));
        let c = a.r.counters();
        assert_eq!(
            (c.schedule_entries, c.planned_outs),
            (before.schedule_entries, before.planned_outs)
        );
        assert!(resident(&a, z));
        assert_eq!(
            a.read(x, CHUNK),
            pattern(1, CHUNK),
            "handoff {handoff}: x back exactly"
        );
        for va in [x, y, z] {
            a.free(va);
        }
        a.f.drain();
    }
    std::fs::write(&path, "3 0 0\n4 zero 0\n").unwrap();
    let f = Fake::leak(1, 3 * CHUNK);
    let e = Residency::new(f, &config(&[("U3M_PLAN", p.as_str())]))
        .err()
        .expect("refused");
    assert!(
        e.starts_with(&format!("U3M_PLAN={p}:2: not a number")),
        "{e}"
    );
}

/// U3M_HANDOFF=on (migrate.rs `evict_ordered`, `take_outgoing`): a chunk
/// the plan has out leaves while its last use is still queued — u3m's
/// device-to-host stream waits for that use on the device — and its HBM goes
/// to the next fault-in before the copy-out lands, that copy-in ordered
/// after it on the device. What the queued operator wrote is what comes
/// back, and the chunk faulted into the taken HBM holds its own bytes. Once
/// the program has queued work that waits for its host
/// (`program_waits_on_host`), the plan waits for the use as without the
/// hand-off: nothing is ordered after program work.
#[test]
fn a_planned_chunk_in_use_leaves_ordered_after_its_use_with_the_handoff() {
    for host_waits in [false, true] {
        let (a, planned, [x, y, z, w]) = handoff_rig();
        if host_waits {
            a.r.program_waits_on_host();
        }
        planned.lock().unwrap().extend([x, z]);
        let s = a.f.app_stream();
        // x = z + 7 and y = z + 9, queued (the fake's streams are lazy); w
        // leaves for them (three chunks of HBM)
        let k: Kernel = Box::new(move |m: &mut Mem<'_>| {
            let v = m.read(z, CHUNK);
            m.write(x, &v.iter().map(|b| b.wrapping_add(7)).collect::<Vec<_>>());
            m.write(y, &v.iter().map(|b| b.wrapping_add(9)).collect::<Vec<_>>());
        });
        a.op(s, &[(z, CHUNK)], &[(x, CHUNK), (y, CHUNK)], k);
        assert!(!resident(&a, w));
        a.r.evict_planned(&[x, z]);
        let c = a.r.counters();
        if host_waits {
            // the use is pending: nothing leaves yet
            assert_eq!((c.ordered_outs, c.planned_outs), (0, 0), "{c:?}");
            assert!(resident(&a, x) && resident(&a, z));
        } else {
            // both leave now, their copies queued after the operator
            assert_eq!((c.ordered_outs, c.planned_outs), (2, 2), "{c:?}");
            let st = a.r.shard_of(0).st.lock().unwrap();
            for va in [x, z] {
                let (id, i) = st.resolve(va).expect("managed");
                assert_ne!(st.chunk(id, i).out_ev, 0, "its copy-out queued");
            }
        }
        // w comes back into HBM still being copied out of (hand-off), or
        // evicts (host_waits)
        assert_eq!(
            a.read(w, CHUNK),
            pattern(4, CHUNK),
            "host_waits {host_waits}"
        );
        if !host_waits {
            assert!(a.r.counters().handoffs >= 1, "{:?}", a.r.counters());
        }
        let zp = pattern(3, CHUNK);
        let plus = |d: u8| zp.iter().map(|b| b.wrapping_add(d)).collect::<Vec<_>>();
        assert_eq!(a.read(x, CHUNK), plus(7), "host_waits {host_waits}: x");
        assert_eq!(a.read(y, CHUNK), plus(9), "host_waits {host_waits}: y");
        assert_eq!(a.read(z, CHUNK), zp, "host_waits {host_waits}: z");
        assert_eq!(
            a.read(w, CHUNK),
            pattern(4, CHUNK),
            "host_waits {host_waits}: w"
        );
        for va in [x, y, z, w] {
            a.free(va);
        }
        a.f.drain();
        assert_eq!(a.f.held().0, 0, "every physical chunk given back");
        a.assert_clean();
    }
}

/// Evictions an outside schedule names (planned.rs): a chunk the policy
/// has out after a call leaves once that call's work is complete — not
/// before, so a dirty one's copy holds what the call wrote — and a chunk
/// it keeps stays, though HBM has room for neither rule to matter.
#[test]
fn a_chunk_the_plan_has_out_leaves_once_its_last_use_ends() {
    let (mut policy, _at) = Script::new();
    let planned = Box::leak(Box::new(Mutex::new(std::collections::HashSet::new())));
    policy.planned = Some(planned);
    let a = App::with_policy(16, Box::new(policy));
    a.r.set_look_ahead(false);
    let (x, y, z) = (a.malloc(CHUNK), a.malloc(CHUNK), a.malloc(CHUNK));
    a.write(z, &pattern(3, CHUNK));
    a.f.drain();
    planned.lock().unwrap().extend([x, z]);
    let s = a.f.app_stream();
    // x = z + 7 and y = z + 9, queued (the fake's streams are lazy)
    let k: Kernel = Box::new(move |m: &mut Mem<'_>| {
        let v = m.read(z, CHUNK);
        m.write(x, &v.iter().map(|b| b.wrapping_add(7)).collect::<Vec<_>>());
        m.write(y, &v.iter().map(|b| b.wrapping_add(9)).collect::<Vec<_>>());
    });
    a.op(s, &[(z, CHUNK)], &[(x, CHUNK), (y, CHUNK)], k);
    a.r.evict_planned(&[x, z]);
    // its work is pending: nothing leaves yet
    assert_eq!(a.r.counters().planned_outs, 0);
    assert!(resident(&a, x) && resident(&a, z));
    a.f.drain();
    // the next call finds the last uses complete: x (dirty, copied out)
    // and z (its host copy current only if it was written back: dirty
    // too, from `write`) leave; y stays
    a.op(s, &[(y, CHUNK)], &[], Box::new(|_: &mut Mem<'_>| {}));
    a.r.evict_planned(&[]);
    assert_eq!(a.r.counters().planned_outs, 2, "{:?}", a.r.counters());
    let leaving = |va: u64| {
        let st = a.r.shard_of(0).st.lock().unwrap();
        let (id, i) = st.resolve(va).expect("managed");
        let c = st.chunk(id, i);
        !c.in_hbm() || c.out_ev != 0
    };
    assert!(leaving(x) && leaving(z), "x and z give up their HBM");
    assert!(!leaving(y), "y is not in the plan: kept");
    let zp = pattern(3, CHUNK);
    assert_eq!(
        a.read(x, CHUNK),
        zp.iter().map(|b| b.wrapping_add(7)).collect::<Vec<_>>()
    );
    assert_eq!(
        a.read(y, CHUNK),
        zp.iter().map(|b| b.wrapping_add(9)).collect::<Vec<_>>()
    );
    assert_eq!(a.read(z, CHUNK), zp);
    a.assert_clean();
}

/// After a copy-out lands, u3m orders its host-to-device stream after it
/// (the HBM it freed may take a copy-in at once) — unless the runtime
/// orders copies by the memory they use itself (`Runtime::orders_pages`:
/// `u3m replay`'s hand-over models, where that wait held every later
/// copy-in behind the copy-out).
#[test]
fn a_landed_copy_out_orders_u3ms_copy_ins_unless_the_runtime_orders_pages() {
    for orders in [false, true] {
        let a = App::new(2, &[]);
        a.f.set_orders_pages(orders);
        let vas: Vec<u64> = (0..3).map(|_| a.malloc(CHUNK)).collect();
        for (k, &va) in vas.iter().enumerate() {
            a.write(va, &pattern(k as u64, CHUNK));
            a.f.drain();
        }
        // the third write evicted a dirty chunk; reading it back harvests
        // that copy-out first
        assert_eq!(a.read(vas[0], CHUNK), pattern(0, CHUNK));
        let u3m = a.r.shard_of(0).st.lock().unwrap().dev(0).stream;
        assert_ne!(u3m, 0);
        let waits = a.f.seen().stream_waits.get(&u3m).copied().unwrap_or(0);
        if orders {
            assert_eq!(waits, 0, "the runtime orders it");
        } else {
            assert!(waits >= 1, "u3m's stream waits for the copy-out");
        }
        a.assert_clean();
    }
}

/// u3m's copy-ins on its own stream complete in the order they were
/// recorded: an eviction's scan that finds one pending takes every later
/// one for pending without asking (the 8-layer LoRA at 1.5 x HBM: 54
/// queries per eviction before, 6 after, the decisions the same).
#[test]
fn a_scan_asks_only_the_earliest_of_u3ms_pending_copy_ins() {
    let (policy, at) = Script::new();
    let a = App::with_policy(8, Box::new(policy));
    a.r.set_look_ahead(false);
    let vas: Vec<u64> = (0..16).map(|_| a.malloc(CHUNK)).collect();
    for (k, &va) in vas.iter().enumerate() {
        a.write(va, &pattern(k as u64, CHUNK));
    }
    a.f.drain();
    let out: Vec<u64> = vas
        .iter()
        .copied()
        .filter(|&va| !resident(&a, va))
        .collect();
    assert_eq!(out.len(), 8);
    // every chunk is needed soon but the first four brought back, which
    // are needed last, the earliest copied in furthest: each scan meets
    // them first, in the order their copy-ins were recorded
    let mut m = at.lock().unwrap();
    m.extend(vas.iter().map(|&va| (va, 1_000)));
    m.extend(
        out[..4]
            .iter()
            .enumerate()
            .map(|(k, &va)| (va, 100_000 - k as u64)),
    );
    drop(m);
    let s = a.f.app_stream();
    // four calls on the program's stream bring them back; the copy-ins stay
    // queued on u3m's stream (lazy streams), so the chunks stay busy
    for &va in &out[..4] {
        a.op(s, &[(va, CHUNK)], &[], add(va, va, 0, 0));
    }
    // their copy-ins' events
    let copy_ins: Vec<u64> = {
        let st = a.r.shard_of(0).st.lock().unwrap();
        let own = st.dev(0).stream;
        out[..4]
            .iter()
            .map(|&va| {
                let (id, i) = st.resolve(va).expect("managed");
                let u = st.chunk(id, i).uses.iter().find(|u| u.0 == own);
                u.expect("a copy-in in flight").1
            })
            .collect()
    };
    let answers = |a: &App| -> u64 {
        let p = a.f.seen().pending_answers;
        copy_ins
            .iter()
            .map(|ev| p.get(ev).copied().unwrap_or(0))
            .sum()
    };
    let before = answers(&a);
    let evictions = a.r.counters().evictions;
    // four more: each eviction's scan passes the four busy ones first
    for &va in &out[4..] {
        a.op(s, &[(va, CHUNK)], &[], add(va, va, 0, 0));
    }
    let evicted = a.r.counters().evictions - evictions;
    let asked = answers(&a) - before;
    assert_eq!(evicted, 4);
    // one per scan: the earliest, found pending
    assert!(
        asked <= evicted,
        "the four copy-ins asked about {asked} times over {evicted} evictions"
    );
    a.f.drain();
    for (k, &va) in vas.iter().enumerate() {
        assert_eq!(a.read(va, CHUNK), pattern(k as u64, CHUNK));
    }
    a.assert_clean();
}

/// Look-ahead under pressure (ahead.rs): a prefetch never evicts a chunk
/// predicted sooner than the prefetched one; it evicts one predicted later
/// (Belady's rule on predictions); a call on the program's stream that needs
/// the prefetched chunk while its copy-in is in flight waits for it.
#[test]
fn look_ahead_evicts_only_later_used_victims_and_calls_wait_for_its_copies() {
    let (policy, at) = Script::new();
    let a = App::with_policy(2, Box::new(policy));
    a.r.set_look_ahead(false);
    let (x, y, z) = (a.malloc(CHUNK), a.malloc(CHUNK), a.malloc(CHUNK));
    at.lock().unwrap().extend([(x, 100), (y, 50), (z, 60)]);
    for (k, &va) in [x, y, z].iter().enumerate() {
        a.write(va, &pattern(k as u64, CHUNK)); // ticks 1, 2, 3: x leaves
    }
    a.f.drain();
    assert!(!resident(&a, x) && resident(&a, y) && resident(&a, z));
    // y round-trips through DRAM so that it is clean (the look-ahead never
    // takes a dirty victim): x in for y, then y in for x
    at.lock().unwrap().extend([(x, 100), (y, 200), (z, 60)]);
    assert_eq!(a.read(x, 64), pattern(0, 64)); // tick 4: y leaves
    at.lock().unwrap().extend([(x, 100), (y, 50), (z, 60)]);
    assert_eq!(a.read(y, 64), pattern(1, 64)); // tick 5: x leaves, y clean
    a.f.drain();
    assert!(!resident(&a, x) && resident(&a, y) && resident(&a, z));
    assert_eq!(a.r.now(), 5);

    // x is due at 10, y at 7, z at 8: HBM holds what is needed sooner
    at.lock().unwrap().extend([(x, 10), (y, 7), (z, 8)]);
    a.r.set_look_ahead(true);
    assert_eq!(a.read(z, 64), pattern(2, 64)); // tick 6
    let c = a.r.counters();
    assert!(!resident(&a, x), "x must not displace y (due at 5 < 8)");
    assert!(resident(&a, y) && resident(&a, z));
    assert_eq!((c.ahead_evictions, c.ahead_prefetches), (0, 0), "{c:?}");
    assert_eq!(c.ahead_full, 1, "{c:?}");

    // y is now needed at 42, far after x: it makes room (a clean victim,
    // dropped; x's copy-in into its HBM). z (dirty) is never taken.
    at.lock().unwrap().insert(y, 42);
    assert_eq!(a.read(z, 64), pattern(2, 64)); // tick 7
    assert_eq!(a.r.counters().ahead_evictions, 1);
    a.f.drain(); // the copy-out lands
    let faults = a.r.counters().faults_in;
    assert_eq!(a.read(z, 64), pattern(2, 64)); // tick 8: x's copy-in issued
    let c = a.r.counters();
    assert!(resident(&a, x) && !resident(&a, y), "{c:?}");
    assert_eq!((c.ahead_prefetches, c.prefetches), (1, 1), "{c:?}");

    // x's copy-in is queued on u3m's stream, not run (lazy fake): an
    // operator on the program's stream that reads x must wait for it
    let s = a.f.app_stream();
    a.op(s, &[(x, CHUNK)], &[(z, CHUNK)], add(x, z, CHUNK, 3));
    let c = a.r.counters();
    assert_eq!(c.faults_in, faults, "x was resident: no fault-in");
    assert_eq!(c.prefetch_hits, 1, "{c:?}");
    a.f.sync_stream(s).unwrap();
    let want: Vec<u8> = pattern(0, CHUNK)
        .iter()
        .map(|b| b.wrapping_add(3))
        .collect();
    assert_eq!(a.read(z, CHUNK), want);
    assert_eq!(a.read(y, CHUNK), pattern(1, CHUNK));
    a.assert_clean();
}

/// A cyclic workload larger than HBM under the predictive policy: the
/// look-ahead turns the calls' fault-ins into prefetches issued a call or
/// more ahead, with the same bytes read back.
#[test]
fn look_ahead_turns_cyclic_fault_ins_into_prefetches() {
    let run = |on: bool| {
        let a = App::new(8, &[("U3M_POLICY", "predictive")]);
        a.r.set_look_ahead(on);
        let vas: Vec<u64> = (0..12).map(|_| a.malloc(CHUNK)).collect();
        for (k, &va) in vas.iter().enumerate() {
            a.write(va, &pattern(k as u64, 256));
        }
        let mut warm = Counters::default();
        for round in 0..12 {
            if round == 6 {
                warm = a.r.counters();
            }
            for (k, &va) in vas.iter().enumerate() {
                assert_eq!(
                    a.read(va, 256),
                    pattern(k as u64, 256),
                    "round {round} chunk {k}"
                );
            }
        }
        let c = a.r.counters();
        a.assert_clean();
        (
            c.faults_in - warm.faults_in,
            c.ahead_prefetches - warm.ahead_prefetches,
            c.prefetch_hits - warm.prefetch_hits,
            c,
        )
    };
    let (off_faults, off_pf, _, off) = run(false);
    let (on_faults, on_pf, on_hits, on) = run(true);
    eprintln!("6 cycles of 12 chunks on 8: off faults {off_faults} prefetches {off_pf}; on faults {on_faults} prefetches {on_pf} hits {on_hits}\n off {off:?}\n on {on:?}");
    assert_eq!(off_pf, 0);
    assert!(off_faults >= 6 * 4, "the cycle does not fit: {off_faults}");
    assert!(
        on_faults * 4 <= off_faults,
        "on {on_faults} off {off_faults}"
    );
    assert!(
        on_pf + on_faults >= off_faults && on_hits >= on_pf * 9 / 10,
        "{on:?}"
    );
}

/// The move log (`set_move_log`, for `u3m replay --audit`) holds every
/// eviction and copy-in once, in clock order: its counts are the counters',
/// each copy-in follows an eviction of the same chunk, a cyclic workload's
/// evictions carry the policy's dated prediction, and turning it off stops it.
#[test]
fn the_move_log_lists_every_eviction_and_copy_in_once() {
    use super::{Move, MoveKind};
    let a = App::new(8, &[("U3M_POLICY", "predictive")]);
    a.r.set_look_ahead(true);
    a.r.set_move_log(true);
    let vas: Vec<u64> = (0..12).map(|_| a.malloc(CHUNK)).collect();
    for (k, &va) in vas.iter().enumerate() {
        a.write(va, &pattern(k as u64, 256));
    }
    for _ in 0..8 {
        for (k, &va) in vas.iter().enumerate() {
            assert_eq!(a.read(va, 256), pattern(k as u64, 256));
        }
    }
    let mut log: Vec<Move> = Vec::new();
    a.r.take_moves(&mut log);
    let c = a.r.counters();
    let count = |f: &dyn Fn(&MoveKind) -> bool| log.iter().filter(|m| f(&m.kind)).count() as u64;
    assert_eq!(count(&|k| matches!(k, MoveKind::Out { .. })), c.evictions);
    assert_eq!(
        count(&|k| matches!(k, MoveKind::Out { dirty: false, .. })),
        c.clean_drops
    );
    assert_eq!(
        count(&|k| matches!(k, MoveKind::In { demand: true })) * CHUNK,
        c.fault_bytes
    );
    assert_eq!(
        count(&|k| matches!(k, MoveKind::In { demand: false })) * CHUNK,
        c.prefetch_bytes
    );
    assert!(c.prefetch_bytes > 0 && c.fault_bytes > 0, "{c:?}");
    assert!(log.windows(2).all(|w| w[0].tick <= w[1].tick));
    let mut out = std::collections::HashSet::new();
    for m in &log {
        assert!(vas.iter().any(|&v| v == m.key), "{m:?}");
        match m.kind {
            MoveKind::Out { next, .. } => {
                assert!(out.insert(m.key), "evicted twice without a copy-in: {m:?}");
                if m.tick > 12 * 3 {
                    // the cycle learnt: the policy dates the next use
                    assert!(next.is_some_and(|t| t > m.tick && t != u64::MAX), "{m:?}");
                }
            }
            MoveKind::In { .. } => assert!(out.remove(&m.key), "copied in unevicted: {m:?}"),
        }
    }
    a.r.take_moves(&mut log);
    let n = log.len();
    a.r.set_move_log(false);
    for &va in &vas {
        a.read(va, 256);
    }
    a.r.take_moves(&mut log);
    assert_eq!(log.len(), n, "off: nothing logged");
    a.assert_clean();
}

/// Predictions that do not come true: the look-ahead notices that its
/// prefetches leave HBM unused and drops to a probe every PROBE_EVERY calls
/// instead of spending the link on them at every call.
#[test]
fn look_ahead_backs_off_when_its_prefetches_go_unused() {
    let (mut policy, at) = Script::new();
    policy.lru = true;
    let a = App::with_policy(4, Box::new(policy));
    a.r.set_look_ahead(true);
    let vas: Vec<u64> = (0..12).map(|_| a.malloc(CHUNK)).collect();
    for (k, &va) in vas.iter().enumerate() {
        a.write(va, &pattern(k as u64, 64));
    }
    let mut mid = Counters::default();
    for call in 0..400u64 {
        if call == 200 {
            mid = a.r.counters();
        }
        // the script says chunks 4.. come next, far before 0..3 — yet the
        // program keeps reading 0..3 only
        let now = a.r.now();
        {
            let mut m = at.lock().unwrap();
            for (k, &va) in vas.iter().enumerate() {
                m.insert(va, if k < 4 { now + 5000 } else { now + 2 });
            }
        }
        let j = (call % 4) as usize;
        assert_eq!(a.read(vas[j], 64), pattern(j as u64, 64));
    }
    let c = a.r.counters();
    eprintln!("{mid:?}\n{c:?}");
    assert!(mid.prefetch_wasted >= 32, "{mid:?}");
    assert!(c.ahead_probes >= 5, "{c:?}");
    let late = c.ahead_prefetches - mid.ahead_prefetches;
    assert!(late >= 1, "probes still prefetch: {c:?}");
    assert!(
        late <= 200 / 32 + 1,
        "second half: {} prefetches",
        c.ahead_prefetches - mid.ahead_prefetches
    );
    a.assert_clean();
}

/// Room for memory u3m does not manage (`make_room`) when the only
/// candidate is named by a fence whose calls are still queued: the first
/// try records the fence and finds it pending; `wait_busy` waits for it
/// without the lock; the second try evicts. Fails if the busy eviction
/// leaves nothing to wait for, or if the wait does not make the chunk idle.
#[test]
fn room_for_unmanaged_memory_waits_for_a_queued_fence() {
    let a = App::new(1, &[]);
    let x = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    let s = a.f.app_stream();
    a.op(s, &[(x, CHUNK)], &[(x, CHUNK)], add(x, x, CHUNK, 2));
    assert!(
        a.r.make_room(0, CHUNK).is_none(),
        "x's call is still queued"
    );
    assert!(a.r.wait_busy(), "the eviction named the fence to wait for");
    assert!(
        a.r.make_room(0, CHUNK).is_some(),
        "x's call has run: x can leave"
    );
    assert!(!a.r.wait_busy(), "nothing left to wait for");
    let want: Vec<u8> = pattern(1, CHUNK)
        .iter()
        .map(|b| b.wrapping_add(2))
        .collect();
    let got = a.read(x, CHUNK);
    assert!(
        got == want,
        "x: {:?}, faults {:?}",
        &got[..8],
        a.f.seen().faults
    );
    a.assert_clean();
}

/// u3m's own copy-ins are still queued on device 0's stream when a thread
/// whose current device is 1 frees the allocation: the free waits for them
/// on device 0 (the runtime refuses a stream of another device; before, the
/// refused synchronisation was ignored and the copies landed in memory
/// already unmapped).
#[test]
fn a_free_from_another_device_waits_for_u3ms_copies() {
    let f = Fake::leak(2, 4 * CHUNK);
    let r = Residency::new(f, &config(&[])).expect("residency");
    f.set_device(0).unwrap();
    let (free, total) = f.mem_info().unwrap();
    let x = r.malloc(0, 2 * CHUNK, free, total).unwrap().unwrap();
    let y = r.malloc(0, 4 * CHUNK, free, total).unwrap().unwrap();
    for (va, seed, len) in [(x, 1, 2 * CHUNK), (y, 2, 4 * CHUNK)] {
        let rs = [Range {
            addr: va,
            len,
            write: true,
            whole: false,
        }];
        let tok = r
            .prepare(0, OpClass::Layout as u8, &rs, true, Order::Host)
            .unwrap();
        f.app_write(va, &pattern(seed, len)).unwrap();
        r.finish(tok, None, true);
    }
    assert_eq!(r.free(y), Some(Ok(()))); // x is in DRAM
    let mut issued = 0;
    for _ in 0..3 {
        issued += r.prefetch(0, 64 * MIB, 1.0, 1000);
    }
    assert_eq!(issued, 2, "x's copy-ins queued on u3m's stream");
    f.set_device(1).unwrap();
    assert_eq!(r.free(x), Some(Ok(())));
    f.drain();
    let seen = f.seen();
    assert!(seen.misuse.is_empty(), "misuse: {:#?}", seen.misuse);
    assert!(seen.faults.is_empty(), "faults: {:#?}", seen.faults);
}

/// A chunk whose copy-in the look-ahead has just queued is not a victim for
/// the next chunk of the same round, even when the policy now dates its use
/// later (its HBM would be unmapped under the queued copy: an MMU fault).
#[test]
fn look_ahead_never_evicts_a_chunk_whose_copy_in_it_just_queued() {
    let (mut policy, at) = Script::new();
    let listed: &'static Mutex<std::collections::HashMap<u64, u64>> =
        Box::leak(Box::new(Mutex::new(std::collections::HashMap::new())));
    policy.listed = Some(listed);
    let a = App::with_policy(3, Box::new(policy));
    a.r.set_look_ahead(false);
    let v: Vec<u64> = (0..5).map(|_| a.malloc(CHUNK)).collect();
    let (x, y, p, q, r) = (v[0], v[1], v[2], v[3], v[4]);
    at.lock()
        .unwrap()
        .extend([(x, 100), (y, 99), (p, 50), (q, 51), (r, 52)]);
    for (k, &va) in v.iter().enumerate() {
        a.write(va, &pattern(k as u64, CHUNK)); // x and y leave for DRAM
    }
    a.free(r); // one chunk of HBM free
    a.f.drain();
    assert!(!resident(&a, x) && !resident(&a, y) && resident(&a, p) && resident(&a, q));
    // listed: x due at +3, y at +4; but asked when, x is far (200) and p, q
    // are needed first
    let now = a.r.now();
    listed.lock().unwrap().extend([(x, now + 3), (y, now + 4)]);
    at.lock()
        .unwrap()
        .extend([(x, now + 200), (y, now + 4), (p, now + 1), (q, now + 2)]);
    a.r.set_look_ahead(true);
    assert_eq!(a.read(p, 64), pattern(2, 64)); // x into the free chunk
    let c = a.r.counters();
    assert_eq!(c.ahead_prefetches, 1, "{c:?}");
    assert!(resident(&a, x) && !resident(&a, y), "{c:?}");
    a.f.drain(); // x's copy runs: onto mapped memory
    assert_eq!(a.read(x, CHUNK), pattern(0, CHUNK));
    assert_eq!(a.read(y, CHUNK), pattern(1, CHUNK));
    a.assert_clean();
}

/// Furthest next use first from a table, with the default `order_ttl`
/// (a kept order is re-keyed, not rebuilt per eviction).
struct TableTtl(&'static Mutex<std::collections::HashMap<u64, u64>>);

impl crate::policy::Placement for TableTtl {
    fn name(&self) -> &'static str {
        "table-ttl"
    }
    fn on_access(&self, _now: u64, _class: u8, _keys: &[u64], _writes: &[Touch]) {}
    fn order(&self, _now: u64, cands: &mut [crate::policy::Cand]) {
        let t = self.0.lock().unwrap();
        cands.sort_by_key(|c| std::cmp::Reverse(t.get(&c.key).copied().unwrap_or(0)));
    }
    fn predicts(&self, _now: u64, _key: u64, _w: u64) -> bool {
        false
    }
}

/// The kept victim order between builds from every candidate: a chunk
/// made resident by a call after the order was built is not in it; after
/// `REBUILD_TAKEN` evictions it is re-keyed into it from the chunks calls
/// touched (`VictimOrder::touched`) and taken first when the policy ranks
/// it first — within the policy's `order_ttl`, without a build from every
/// candidate.
#[test]
fn a_chunk_touched_since_the_order_was_built_is_re_keyed_into_it() {
    let at: &'static Mutex<std::collections::HashMap<u64, u64>> =
        Box::leak(Box::new(Mutex::new(std::collections::HashMap::new())));
    let n = 36u64;
    let a = App::with_policy(n, Box::new(TableTtl(at)));
    a.r.set_look_ahead(false);
    let c: Vec<u64> = (0..n).map(|_| a.malloc(CHUNK)).collect();
    let x = a.malloc(CHUNK);
    let d: Vec<u64> = (0..33).map(|_| a.malloc(CHUNK)).collect();
    {
        let mut t = at.lock().unwrap();
        t.extend(c.iter().enumerate().map(|(k, &va)| (va, 1000 + k as u64)));
        t.insert(x, 10);
    }
    for (k, &va) in c.iter().enumerate() {
        a.write(va, &pattern(k as u64, 64)); // ticks 1-36: HBM full
    }
    // tick 37: the order is built from every candidate (x is not one yet);
    // the furthest, c35, leaves
    a.write(x, &pattern(99, 64));
    assert!(!resident(&a, c[35]) && resident(&a, x));
    let full_at = a.r.shard_of(0).st.lock().unwrap().dev(0).order.full_at;
    // x is now the furthest
    at.lock().unwrap().insert(x, 1_000_000);
    // tick 38: one call needs 33 chunks: 31 more evictions from the kept
    // order (c34 down), then it is re-keyed with x and x goes first
    let rs: Vec<Range> = d
        .iter()
        .map(|&addr| Range {
            addr,
            len: 64,
            write: true,
            whole: false,
        })
        .collect();
    a.sync(&rs, true, || Ok(())).expect("call");
    assert!(!resident(&a, x), "x is in the re-keyed order and first");
    assert!(resident(&a, c[2]), "{:?}", a.r.counters());
    {
        let st = a.r.shard_of(0).st.lock().unwrap();
        let o = &st.dev(0).order;
        assert_eq!(o.full_at, full_at, "re-keyed, not built again");
        assert!(o.built_at >= full_at && o.taken < 32);
    }
    for (k, &va) in c.iter().enumerate() {
        assert_eq!(a.read(va, 64), pattern(k as u64, 64));
    }
    assert_eq!(a.read(x, 64), pattern(99, 64));
    a.assert_clean();
}

/// `prepare` without the lock for ranges outside every managed VA range,
/// and with it for a range that reaches one by a single byte; an
/// operator's ranges carved out of one allocation (the walk of `vas`
/// skipped for all but the first, chunks merged in order) and ranges out
/// of order over two allocations name each chunk once, written if any
/// range writes it.
#[test]
fn prepare_names_each_chunk_once_and_skips_unmanaged_ranges() {
    let app = App::new(16, &[]);
    let a = app.malloc(4 * CHUNK);
    let b = app.malloc(2 * CHUNK);
    let (lo, hi) = (a.min(b), (a + 4 * CHUNK).max(b + 2 * CHUNK));
    let r = |addr: u64, len: u64, write: bool| Range {
        addr,
        len,
        write,
        whole: false,
    };
    let chunks = |rs: &[Range]| {
        let tok = app
            .r
            .prepare(0, OpClass::Layout as u8, rs, false, Order::Host)
            .expect("prepare");
        let mut v: Vec<(u64, u32, bool)> = tok
            .tok
            .chunks()
            .iter()
            .zip(tok.tok.writes())
            .map(|(&(id, i), &w)| (id, i, w.writes()))
            .collect();
        app.r.finish(tok, None, true);
        v.sort();
        v
    };
    assert!(chunks(&[r(lo - 4096, 4096, true)]).is_empty());
    assert!(chunks(&[r(hi, 4096, true), r(lo - 1, 1, false)]).is_empty());
    assert_eq!(chunks(&[r(lo - 4096, 4097, false)]).len(), 1);
    assert_eq!(chunks(&[r(hi - 1, 1, false)]).len(), 1);
    // four ranges in chunk 0 of `a`, the last one written, then chunk 2
    let k = 64 * 1024;
    let op = [
        r(a, k, false),
        r(a + k, k, false),
        r(a + 2 * k, k, false),
        r(a + 3 * k, k, true),
        r(a + 2 * CHUNK + 5, k, false),
    ];
    let got = chunks(&op);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (got[0].1, got[0].2, got[1].1, got[1].2),
        (0, true, 2, false)
    );
    // out of order, over both allocations, chunk 1 of `a` twice
    let mixed = [
        r(b + CHUNK, 10, true),
        r(a + CHUNK, 10, false),
        r(b, 10, false),
        r(a + CHUNK + 100, 10, true),
        r(a + 3 * CHUNK - 1, 2, false),
    ];
    let got = chunks(&mixed);
    let ids: std::collections::BTreeSet<u64> = got.iter().map(|c| c.0).collect();
    assert_eq!(ids.len(), 2);
    let of = |va: u64| {
        got.iter()
            .filter(|c| c.0 == chunks(&[r(va, 1, false)])[0].0)
            .map(|c| (c.1, c.2))
            .collect::<Vec<_>>()
    };
    assert_eq!(of(a), vec![(1, true), (2, false), (3, false)]);
    assert_eq!(of(b), vec![(0, false), (1, true)]);
}

/// A copy-in refused by the runtime (the soak test's injected copy faults)
/// fails the call, and the chunk stays out of HBM with its host copy the
/// only one: the next read brings the data back. Before, the chunk kept the
/// fresh HBM it was given and counted as resident and clean, and the next
/// read returned zeros (soak: `read 00, expected 38`).
#[test]
fn a_refused_copy_in_fails_the_call_and_loses_no_data() {
    let a = App::new(2, &[]);
    let vas: Vec<u64> = (0..3).map(|_| a.malloc(CHUNK)).collect();
    for (k, &va) in vas.iter().enumerate() {
        a.write(va, &pattern(k as u64, CHUNK));
    }
    // three chunks on two: the first is in DRAM now
    let before = a.f.seen().h2d;
    a.f.fail_h2d(1);
    let rs = [Range {
        addr: vas[0],
        len: CHUNK,
        write: false,
        whole: false,
    }];
    let r = a.sync(&rs, false, || a.f.app_read(vas[0], CHUNK));
    assert!(r.is_err(), "the refused copy-in must fail the call");
    assert_eq!(a.f.seen().h2d, before, "no copy-in went through");
    // every chunk reads back what was written, in any order
    for round in 0..2 {
        for (k, &va) in vas.iter().enumerate() {
            let got = a.read(va, CHUNK);
            let bad = got
                .iter()
                .zip(pattern(k as u64, CHUNK))
                .filter(|(g, w)| **g != *w)
                .count();
            assert_eq!(bad, 0, "round {round} chunk {k}: {bad} bytes differ");
        }
    }
    a.assert_clean();
}

/// Residency state per device (issue 10 part 2): device 0's copy-in is held
/// inside the runtime — its thread blocked in `memcpy_async` with device
/// 0's residency lock held (checked) — while a thread on device 1 allocates,
/// writes (evicting and copying back in on device 1), reads, runs an
/// operator and frees. Under one lock for every device the device-1 thread
/// waits for device 0's copy and the deadline below fails the test.
#[test]
fn device_1_never_waits_for_device_0s_residency_work() {
    let f = Fake::leak(2, 2 * CHUNK);
    f.set_per_thread_device();
    f.set_eager(true);
    let r: &'static Residency = Box::leak(Box::new(
        Residency::new(f, &config(&[])).expect("residency"),
    ));
    // device 0: x goes to DRAM, so reading it back needs a copy-in
    let (free, total) = f.mem_info().unwrap();
    let x = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let call = |dev: u32, va: u64, len: u64, data: Option<&[u8]>| -> Vec<u8> {
        sync_call(r, f, dev, va, len, data).expect("call")
    };
    call(0, x, CHUNK, Some(&pattern(1, CHUNK)));
    assert!(r.make_room(0, 2 * CHUNK).is_some(), "x evicted");
    assert_eq!(r.usage(0).0, 0);
    f.hold_copy_ins(0);
    let dev0 = std::thread::spawn(move || {
        f.set_device(0).unwrap();
        call(0, x, CHUNK, None)
    });
    assert_eq!(f.copy_ins_held(10_000), 1, "device 0's copy-in is held");
    assert!(
        matches!(
            r.shard_of(0).st.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        ),
        "device 0's residency lock is held across its copy"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let dev1 = std::thread::spawn(move || {
        f.set_device(1).unwrap();
        let (free, total) = f.mem_info().unwrap();
        let v: Vec<u64> = (0..3)
            .map(|_| r.malloc(1, CHUNK, free, total).unwrap().unwrap())
            .collect();
        for (k, &va) in v.iter().enumerate() {
            call(1, va, CHUNK, Some(&pattern(10 + k as u64, CHUNK)));
        }
        // two chunks of HBM: reading all three back evicts and copies in
        for (k, &va) in v.iter().enumerate() {
            assert_eq!(call(1, va, CHUNK, None), pattern(10 + k as u64, CHUNK));
        }
        let s = f.app_stream();
        let (a, b) = (v[0], v[1]);
        let tok = r
            .prepare(
                1,
                OpClass::Layout as u8,
                &[
                    Range {
                        addr: a,
                        len: CHUNK,
                        write: false,
                        whole: false,
                    },
                    Range {
                        addr: b,
                        len: CHUNK,
                        write: true,
                        whole: false,
                    },
                ],
                false,
                Order::Stream(s),
            )
            .expect("prepare");
        f.app_launch(
            s,
            "copy a to b",
            vec![(a, CHUNK), (b, CHUNK)],
            Box::new(move |m: &mut Mem<'_>| {
                let d = m.read(a, CHUNK);
                m.write(b, &d);
            }),
        )
        .unwrap();
        r.finish(tok, Some(s), true);
        f.sync_stream(s).unwrap();
        assert_eq!(call(1, b, CHUNK, None), pattern(10, CHUNK));
        for va in v {
            assert_eq!(r.free(va), Some(Ok(())));
        }
        tx.send(()).unwrap();
    });
    let done = rx.recv_timeout(std::time::Duration::from_secs(20));
    // still held: everything above ran while device 0's copy was in the runtime
    let still_held = f.copy_ins_held(0) == 1
        && matches!(
            r.shard_of(0).st.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        );
    f.release_copy_ins();
    dev1.join().expect("device 1's thread");
    assert_eq!(dev0.join().expect("device 0's thread"), pattern(1, CHUNK));
    assert!(
        done.is_ok(),
        "device 1's malloc/prepare/finish/free waited for device 0's copy-in"
    );
    assert!(still_held, "device 0's copy was released early");
    f.set_device(0).unwrap();
    assert_eq!(r.free(x), Some(Ok(())));
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
}

/// Two devices of two chunks each (per-thread current device, queued work
/// run at once), u3m in front, and one written chunk on each device of
/// `devs` in turn, chunk k holding `pattern(k + 1)`.
fn written_on_devices(devs: &[u32]) -> (&'static Fake, Residency, Vec<u64>) {
    let f = Fake::leak(2, 2 * CHUNK);
    f.set_per_thread_device();
    f.set_eager(true);
    let r = Residency::new(f, &config(&[])).expect("residency");
    let (free, total) = f.mem_info().unwrap();
    let mut vas = Vec::new();
    for (k, &dev) in devs.iter().enumerate() {
        let va = r.malloc(dev, CHUNK, free, total).unwrap().unwrap();
        f.set_device(dev).unwrap();
        let rs = [Range {
            addr: va,
            len: CHUNK,
            write: true,
            whole: false,
        }];
        let tok = r
            .prepare(dev, OpClass::Layout as u8, &rs, true, Order::Host)
            .unwrap();
        f.app_write(va, &pattern(k as u64 + 1, CHUNK)).unwrap();
        r.finish(tok, None, true);
        vas.push(va);
    }
    (f, r, vas)
}

/// A call on device 1 whose ranges span both devices' managed memory (a
/// peer copy) makes device 0's chunk resident — it was in DRAM — on device
/// 0's state, pins both devices' chunks for the call, and gives every pin
/// back: each device's chunk can be evicted afterwards.
#[test]
fn a_call_spanning_two_devices_prepares_each_devices_chunks() {
    let (f, r, vas) = written_on_devices(&[0, 1]);
    let [x, y] = [vas[0], vas[1]];
    f.set_device(0).unwrap();
    assert!(r.make_room(0, 2 * CHUNK).is_some(), "x evicted");
    assert_eq!(r.usage(0).0, 0);
    f.set_device(1).unwrap();
    let s = f.app_stream();
    let rs = [
        Range {
            addr: x,
            len: CHUNK,
            write: false,
            whole: false,
        },
        Range {
            addr: y,
            len: CHUNK,
            write: true,
            whole: false,
        },
    ];
    let tok = r
        .prepare(1, OpClass::Layout as u8, &rs, false, Order::Stream(s))
        .expect("prepare");
    assert_eq!(
        (tok.tok.chunks().len(), tok.more.len()),
        (1, 1),
        "one chunk per device"
    );
    assert_eq!(r.usage(0).0, CHUNK, "x is back in device 0's HBM");
    // pinned: neither device can evict them during the call
    f.set_device(0).unwrap();
    assert!(r.make_room(0, 2 * CHUNK).is_none());
    f.set_device(1).unwrap();
    assert!(r.make_room(1, 2 * CHUNK).is_none());
    f.app_launch(
        s,
        "peer copy x to y",
        vec![(x, CHUNK), (y, CHUNK)],
        Box::new(move |m: &mut Mem<'_>| {
            let d = m.read(x, CHUNK);
            m.write(y, &d);
        }),
    )
    .unwrap();
    r.finish(tok, Some(s), true);
    f.sync_stream(s).unwrap();
    assert_eq!(f.app_read(y, CHUNK).unwrap(), pattern(1, CHUNK));
    // the pins are gone: each device evicts its chunk
    f.set_device(0).unwrap();
    assert!(r.make_room(0, 2 * CHUNK).is_some());
    f.set_device(1).unwrap();
    assert!(r.make_room(1, 2 * CHUNK).is_some());
    assert_eq!((r.usage(0).0, r.usage(1).0), (0, 0));
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
}

/// A chunk of device 0 faulted in by a call of a device-1 thread (a peer
/// copy) finds room on device 0, whatever device 1 has free: HBM is asked
/// of the chunk's device. When it was asked of the calling thread's, a
/// full device 1 made device 0's empty HBM look full, and the fault-in
/// found nothing of device 0's to evict and failed.
#[test]
fn a_chunk_of_another_device_is_faulted_in_against_its_own_devices_room() {
    let (f, r, vas) = written_on_devices(&[0, 1, 1]);
    let x = vas[0];
    f.set_device(0).unwrap();
    assert!(r.make_room(0, 2 * CHUNK).is_some(), "x to DRAM");
    assert_eq!(r.usage(0).0, 0);
    // device 1 full, device 0 empty: a device-1 thread reads x
    f.set_device(1).unwrap();
    assert_eq!(f.mem_info().unwrap().0, 0, "device 1 is full");
    let rs = [Range {
        addr: x,
        len: CHUNK,
        write: false,
        whole: false,
    }];
    let tok = r
        .prepare(1, OpClass::Layout as u8, &rs, true, Order::Host)
        .expect("x faulted in on device 0");
    assert_eq!(f.app_read(x, CHUNK).unwrap(), pattern(1, CHUNK));
    r.finish(tok, None, true);
    assert_eq!((r.usage(0).0, r.usage(1).0), (CHUNK, 2 * CHUNK));
    assert_no_misuse_or_fault(&f.seen());
}

/// mt_stress on two devices (the fake runtime): two threads per device,
/// each allocating, writing, overwriting, reading back and freeing its own
/// buffers under constant eviction pressure (4 chunks of HBM per device,
/// working sets of up to 8), every byte read back checked against a model.
/// Device states evict, copy in and free concurrently while sharing the
/// DRAM store and the VA routing; nothing faults, nothing misuses the
/// runtime, and every byte of host memory and HBM is given back.
#[test]
fn two_devices_stress_under_eviction_loses_nothing() {
    let s = two_devices_stress(true);
    eprintln!(
        "two devices: host waits with the device's own lock held: {:?}",
        s.locked_waits
    );
}

/// The two-device stress (see above); `eager`: the fake runs each copy as
/// it is queued (else only when someone waits for it: events stay pending
/// and the waits without the lock really wait). Returns what the fake saw,
/// `finalize` included (it waits for u3m's streams before taking the
/// lock: on da4269a it did with the lock held, 2 waits per run).
fn two_devices_stress(eager: bool) -> super::fake::Seen {
    two_devices_stress_with(eager, &[]).0
}

/// `two_devices_stress` with the residency config `vars`; also returns
/// the counters (taken before finalize).
fn two_devices_stress_with(eager: bool, vars: &[(&str, &str)]) -> (super::fake::Seen, Counters) {
    let f = Fake::leak(2, 4 * CHUNK);
    f.set_per_thread_device();
    f.set_eager(eager);
    let r: &'static Residency = Box::leak(Box::new(
        Residency::new(f, &config(vars)).expect("residency"),
    ));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let dev = (t % 2) as u32;
                f.set_device(dev).unwrap();
                let call = |va: u64, at: u64, len: u64, data: Option<&[u8]>| {
                    sync_call(r, f, dev, va + at, len, data).expect("call")
                };
                let mut rnd = crate::test_rng(t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                let mut bufs: Vec<(u64, Vec<u8>)> = Vec::new();
                let mut verified = 0u64;
                for k in 0..120u64 {
                    match rnd(4) {
                        0 if bufs.len() < 4 => {
                            let len = (1 + rnd(2)) * CHUNK;
                            let (free, total) = f.mem_info().unwrap();
                            let va = r.malloc(dev, len, free, total).unwrap().unwrap();
                            let data = pattern(t * 1000 + k, len);
                            call(va, 0, len, Some(&data));
                            bufs.push((va, data));
                        }
                        1 if !bufs.is_empty() => {
                            let b = rnd(bufs.len() as u64) as usize;
                            let len = bufs[b].1.len() as u64;
                            let at = rnd(len / 4096) * 4096;
                            let n = (len - at).min(3 * 4096 + rnd(CHUNK));
                            let data = pattern(t * 7919 + k, n);
                            call(bufs[b].0, at, n, Some(&data));
                            bufs[b].1[at as usize..(at + n) as usize].copy_from_slice(&data);
                        }
                        2 if bufs.len() > 2 => {
                            let b = rnd(bufs.len() as u64) as usize;
                            let (va, _) = bufs.swap_remove(b);
                            assert_eq!(r.free(va), Some(Ok(())));
                        }
                        _ if !bufs.is_empty() => {
                            let b = rnd(bufs.len() as u64) as usize;
                            let (va, ref model) = bufs[b];
                            let got = call(va, 0, model.len() as u64, None);
                            assert!(got == *model, "thread {t} buffer {va:#x}: bytes differ");
                            verified += model.len() as u64;
                        }
                        _ => {}
                    }
                }
                for (va, model) in bufs {
                    assert!(call(va, 0, model.len() as u64, None) == model);
                    verified += model.len() as u64;
                    assert_eq!(r.free(va), Some(Ok(())));
                }
                verified
            })
        })
        .collect();
    let verified: u64 = threads
        .into_iter()
        .map(|h| h.join().expect("stress thread"))
        .sum();
    assert!(verified > 0);
    let c = r.counters();
    assert!(c.evictions > 0 && c.faults_in > 0, "{c:?}");
    assert_eq!((r.usage(0).0, r.usage(1).0), (0, 0));
    let counters = r.counters();
    r.finalize();
    f.drain();
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
    assert_eq!(f.held(), (0, 0), "handles / pinned host bytes left");
    // a thread never waits holding another device's lock besides its own
    assert!(s.max_locks_at_wait <= 1, "{s:?}");
    (s, counters)
}

/// Issue 10 part 2, "no lock held across a device or stream
/// synchronisation or a copy": the two-device stress (synchronous calls
/// faulting chunks in, evictions copying out to DRAM, frees), with copies
/// that run only when waited for and with copies run as queued, asks the
/// runtime for no host wait while its thread holds a residency lock —
/// finalize included. On main before this change it asked 266 (eager): the
/// host-ordered fault-in's stream sync, after_copy_ins' event sync, a
/// free's device sync and reclaim's stream sync.
#[test]
fn the_two_device_stress_waits_with_no_residency_lock_held() {
    for eager in [false, true] {
        let s = two_devices_stress(eager);
        assert!(
            s.locked_waits.is_empty(),
            "eager {eager}: host waits with a residency lock held: {:?}",
            s.locked_waits
        );
    }
}

/// A synchronous call's copy-in is waited for without the device's lock:
/// while that wait is held inside the runtime, another thread on the same
/// device allocates, writes, evicts (never the arriving chunk: it is
/// pinned and its copy pending) and reads back; a second synchronous
/// reader of the arriving chunk waits for the same copy and reads its
/// bytes, never the fresh HBM's; and a free waits for u3m's copies
/// unlocked too. Every byte is checked; nothing faults or misuses.
#[test]
fn a_host_wait_for_a_copy_in_holds_no_residency_lock() {
    let f = Fake::leak(1, 2 * CHUNK);
    f.set_per_thread_device();
    // not eager: a copy runs only when someone waits for it
    let r: &'static Residency = Box::leak(Box::new(
        Residency::new(f, &config(&[])).expect("residency"),
    ));
    let call = |va: u64, data: Option<&[u8]>| -> Vec<u8> {
        sync_call(r, f, 0, va, CHUNK, data).expect("call")
    };
    let (free, total) = f.mem_info().unwrap();
    let x = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    call(x, Some(&pattern(1, CHUNK)));
    assert!(r.make_room(0, 2 * CHUNK).is_some(), "x evicted");
    assert_eq!(r.usage(0).0, 0);
    f.drain();
    let waits_before = f.seen().locked_waits;
    // the next host wait (the reader's, for x's copy-in) is held
    f.hold_waits(1);
    let reader = std::thread::spawn(move || call(x, None));
    assert_eq!(f.waits_held(10_000), 1, "the reader waits for x's copy-in");
    let st = r.shard_of(0).st.try_lock();
    assert!(st.is_ok(), "the device's lock is free during the wait");
    drop(st);
    // the same device, meanwhile: y and z on a 2-chunk HBM whose other
    // chunk is x, arriving: z's room comes from y, never from x
    let other = std::thread::spawn(move || {
        let (free, total) = f.mem_info().unwrap();
        let y = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
        let z = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
        call(y, Some(&pattern(2, CHUNK)));
        assert_eq!(call(y, None), pattern(2, CHUNK));
        call(z, Some(&pattern(3, CHUNK)));
        // a second reader of x orders itself after the same copy-in
        assert_eq!(call(x, None), pattern(1, CHUNK), "x read before it landed");
        (y, z)
    });
    let (y, z) = other.join().expect("the other thread");
    f.release_waits();
    assert_eq!(reader.join().expect("reader"), pattern(1, CHUNK));
    // y went to DRAM for z: reading it back copies it in again
    assert_eq!(call(y, None), pattern(2, CHUNK));
    assert_eq!(call(z, None), pattern(3, CHUNK));
    for va in [x, y, z] {
        assert_eq!(r.free(va), Some(Ok(())));
    }
    assert_eq!(r.usage(0).0, 0);
    let s = f.seen();
    assert_eq!(
        s.locked_waits, waits_before,
        "host waits with the residency lock held"
    );
    assert_no_misuse_or_fault(&s);
    let c = r.counters();
    assert!(c.evictions >= 2 && c.faults_in >= 3, "{c:?}");
}

/// u3m's copy streams belong to their chunk's device whoever's thread first
/// needs them: a call on device 1 reading a device-0 chunk that is on the
/// host (a peer copy) faults it in on device 0's stream, created and used on
/// device 0; device 0's own calls then use the same stream. The runtime
/// refuses a stream used from another device's context (the fake and the
/// simulator: ACL_ERROR_RT_STREAM_CONTEXT), so with the stream created in
/// device 1's context one of the two calls fails.
#[test]
fn copy_streams_are_created_and_used_on_their_own_device() {
    let f = Fake::leak(2, 2 * CHUNK);
    f.set_per_thread_device();
    f.set_eager(true);
    let r = Residency::new(f, &config(&[])).expect("residency");
    let (free, total) = f.mem_info().unwrap();
    f.set_device(0).unwrap();
    let x = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let y = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let z = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let write = |va: u64, seed: u64| {
        sync_call(&r, f, 0, va, CHUNK, Some(&pattern(seed, CHUNK))).unwrap();
    };
    write(x, 7);
    // device 1's thread reads x (on the host) first, then device 0's: each
    // read faults x in on device 0's copy stream
    for (k, dev) in [1u32, 0, 1].into_iter().enumerate() {
        // y and z (dirty) fill device 0's HBM: x is on the host and the
        // read must evict one of them, on device 0
        f.set_device(0).unwrap();
        write(y, 8 + k as u64);
        write(z, 16 + k as u64);
        assert_eq!(r.usage(0).0, 2 * CHUNK);
        f.set_device(dev).unwrap();
        let got = sync_call(&r, f, dev, x, CHUNK, None).unwrap_or_else(|e| {
            panic!(
                "device {dev}'s read of device 0's chunk: {e:?}; {:?}",
                f.seen().misuse
            )
        });
        assert_eq!(got, pattern(7, CHUNK));
        assert_eq!(
            f.current_device(),
            Some(dev),
            "the caller's device is restored"
        );
    }
    f.set_device(0).unwrap();
    for (va, seed) in [(y, 10), (z, 18)] {
        let got = sync_call(&r, f, 0, va, CHUNK, None).unwrap();
        assert_eq!(got, pattern(seed, CHUNK));
    }
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
}

/// A thread on device 1 with a context of its own (aclrtCreateContext)
/// whose read makes u3m fault a device-0 chunk in on device 0's stream gets
/// its own context back, not device 1's default one (the switch back by
/// device alone would leave its next launch in the wrong context).
#[test]
fn a_cross_device_copy_gives_the_caller_its_own_context_back() {
    let f = Fake::leak(2, 2 * CHUNK);
    f.set_per_thread_device();
    f.set_eager(true);
    let r = Residency::new(f, &config(&[])).expect("residency");
    let (free, total) = f.mem_info().unwrap();
    f.set_device(0).unwrap();
    let x = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let y = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let z = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    sync_call(&r, f, 0, x, CHUNK, Some(&pattern(7, CHUNK))).unwrap();
    for k in 0..2u64 {
        // y and z fill device 0's HBM: x goes to the host
        f.set_device(0).unwrap();
        sync_call(&r, f, 0, y, CHUNK, Some(&pattern(8 + k, CHUNK))).unwrap();
        sync_call(&r, f, 0, z, CHUNK, Some(&pattern(16 + k, CHUNK))).unwrap();
        let ctx = f.create_context(1);
        let got = sync_call(&r, f, 1, x, CHUNK, None).unwrap();
        assert_eq!(got, pattern(7, CHUNK));
        assert_eq!(f.current_device(), Some(1));
        assert_eq!(
            f.current_context(),
            Some(ctx),
            "the caller's own context is restored (round {k})"
        );
    }
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
}

/// A forked child makes its own device-to-host stream: the parent's (its
/// `out_stream`) does not exist in the child's runtime, like its copy-in
/// stream. The parent evicts a dirty chunk asynchronously (the copy-out
/// stream exists), frees two chunks and forks; the child's own chunks fill
/// HBM, and its eviction of one must queue its copy-out on a stream of its
/// own, not the parent's.
#[test]
fn a_forked_child_copies_out_on_a_stream_of_its_own() {
    let (f, r, free, total) = eager_residency(4);
    let mut vas = Vec::new();
    for k in 0..5u64 {
        let va = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
        sync_call(&r, f, 0, va, CHUNK, Some(&pattern(k, CHUNK))).unwrap();
        vas.push(va);
    }
    assert!(
        r.counters().evictions > 0,
        "the parent evicted (on its copy-out stream)"
    );
    // two chunks' HBM free at the fork (the two written last are resident)
    for &va in &vas[3..] {
        assert_eq!(r.free(va), Some(Ok(())));
    }
    assert_eq!(r.usage(0).0, 2 * CHUNK, "two chunks resident at the fork");
    // the child: the parent's streams are gone
    f.forget_streams();
    r.after_fork_child(None).expect("child");
    let a = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let b = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let c = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    for (k, va) in [a, b, c].into_iter().enumerate() {
        sync_call(&r, f, 0, va, CHUNK, Some(&pattern(100 + k as u64, CHUNK)))
            .unwrap_or_else(|e| panic!("child's write {k}: {e:?}; {:?}", f.seen().misuse));
    }
    for (k, va) in [a, b, c].into_iter().enumerate() {
        let got = sync_call(&r, f, 0, va, CHUNK, None).unwrap();
        assert_eq!(got, pattern(100 + k as u64, CHUNK));
    }
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
}

/// A forked child forgets the event recorded after the parent's latest
/// copy-ins (`Dev::last_in`, read by demand eviction's link-idle rule):
/// it names a runtime object of the parent's.
#[test]
fn a_forked_child_forgets_the_parents_last_copy_in() {
    let (f, r, free, total) = eager_residency(2);
    let vas: Vec<u64> = (0..3u64)
        .map(|k| {
            let va = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
            sync_call(&r, f, 0, va, CHUNK, Some(&pattern(k, CHUNK))).unwrap();
            va
        })
        .collect();
    // the first one went out; reading it back copies it in
    let got = sync_call(&r, f, 0, vas[0], CHUNK, None).unwrap();
    assert_eq!(got, pattern(0, CHUNK));
    let last_in = |r: &Residency| r.shard_of(0).st.lock().unwrap().devs[0].last_in;
    assert_ne!(last_in(&r), 0, "the parent's copy-in recorded an event");
    f.forget_streams();
    r.after_fork_child(None).expect("child");
    assert_eq!(last_in(&r), 0, "the child forgot the parent's event");
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
}

/// A forked child forgets the rooms its parent's threads kept for their
/// allocations' retries (no `Room` of the child gives them back). The
/// child never evicts a chunk resident at the fork (its page is the
/// parent's too), so its fault-ins have the free HBM only: with the
/// parent's kept bytes hiding it, the child's read fails with 207001.
#[test]
fn a_forked_child_forgets_the_rooms_its_parent_kept() {
    let (f, r, [x, y]) = two_written_chunks();
    // the parent's thread between its make_room and its retry
    std::mem::forget(r.make_room(0, CHUNK).expect("one evicted"));
    f.forget_streams();
    r.after_fork_child(None).expect("child");
    for (k, va) in [x, y].into_iter().enumerate() {
        assert_eq!(
            sync_call(&r, f, 0, va, CHUNK, None).expect("read"),
            pattern(k as u64 + 1, CHUNK)
        );
    }
    assert_eq!(r.usage(0).0, 2 * CHUNK, "both resident: nothing kept");
    assert_no_misuse_or_fault(&f.seen());
}

/// In a forked child the chunks resident at the fork never move (their
/// pages are the parent's too), so nothing resident may move until the
/// child makes its own; a chunk in a call in flight may.
#[test]
fn what_was_resident_at_the_fork_never_counts_as_movable() {
    let (f, r, [x, _y]) = two_written_chunks();
    assert!(r.may_move(0), "the parent's chunks move");
    f.forget_streams();
    r.after_fork_child(None).expect("child");
    assert_eq!(r.usage(0).0, 2 * CHUNK);
    assert!(!r.may_move(0), "the parent's pages, pinned in the child");
    // evicted in the child? never: a read of x is served where it is
    assert_eq!(
        sync_call(&r, f, 0, x, CHUNK, None).expect("read"),
        pattern(1, CHUNK)
    );
    assert!(!r.may_move(0));
    assert!(!r.may_move(1), "another device has nothing");
    assert_no_misuse_or_fault(&f.seen());
}

/// One device of `chunks` chunks whose queued work runs at once, u3m in
/// front of it with the default configuration, and its (free, total).
fn eager_residency(chunks: u64) -> (&'static Fake, Residency, u64, u64) {
    let f = Fake::leak(1, chunks * CHUNK);
    f.set_eager(true);
    let r = Residency::new(f, &config(&[])).expect("residency");
    let (free, total) = f.mem_info().unwrap();
    (f, r, free, total)
}

/// Demand eviction when the front of the order is in use by queued work
/// (a full-parameter AdamW step: the chunks the optimizer just wrote are
/// predicted furthest and still queued). More than the 64 nearest
/// candidates are busy; behind them an idle chunk predicted almost as far
/// is taken instead of waiting for the device (Belady's rule with a cost:
/// MIN evicts it before its next use anyway), while an idle chunk needed
/// much sooner is not (evicting it would cost a fetch MIN does not make):
/// then the fault-in waits — while a copy-in of u3m's is in flight, for
/// that copy-in, not for the busy front (whose queued operator stays
/// queued): with the copy-ins landed, a wait for the front would leave the
/// link idle until the device reached it, and x is taken (13B LoRA at 1.5
/// x HBM: 262.3 -> 251.5 ms per step, the same bytes, with no copy-in in
/// flight; 251.5 -> 244.9 waiting for them, simulated) — unless the idle
/// one met is needed inside the look-ahead window, where the look-ahead
/// would fetch it right back (`x_next` 0: x two calls on, so that every
/// idle candidate, y and the z's at 100-102 first, is inside it): then the
/// front's use is waited for and the front leaves.
/// Returns (front resident, x resident, the busy operator ran).
#[test]
fn a_busy_front_gives_way_to_an_idle_victim_near_it_not_to_one_needed_soon() {
    let run = |x_next: u64, busy_link: bool| {
        let (mut policy, at) = Script::new();
        // the order is kept between evictions (as predictive's): the
        // second fault-in below reuses what the first one's scan learnt
        policy.ttl = 1000;
        let a = App::with_policy(70, Box::new(policy));
        a.r.set_look_ahead(false);
        let busy: Vec<u64> = (0..66).map(|_| a.malloc(CHUNK)).collect();
        let (x, y, z1, z2) = (
            a.malloc(CHUNK),
            a.malloc(CHUNK),
            a.malloc(CHUNK),
            a.malloc(CHUNK),
        );
        {
            let mut at = at.lock().unwrap();
            for (k, &b) in busy.iter().enumerate() {
                at.insert(b, 1010 + k as u64); // the last is the front
            }
            at.extend([(x, x_next), (y, 100), (z1, 101), (z2, 102)]);
        }
        for (k, &va) in busy.iter().chain(&[x, y, z1, z2]).enumerate() {
            a.write(va, &pattern(k as u64, 256)); // HBM full: 70 chunks
        }
        // one queued operator (the lazy fake runs it only when waited for)
        // reads every busy chunk
        let s = a.f.app_stream();
        let ins: Vec<(u64, u64)> = busy.iter().map(|&b| (b, CHUNK)).collect();
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r2 = ran.clone();
        a.op(
            s,
            &ins,
            &[],
            Box::new(move |_m: &mut Mem<'_>| r2.store(true, Relaxed)),
        );
        if busy_link {
            copy_in_in_flight(&a);
        }
        if x_next == 0 {
            at.lock().unwrap().insert(x, a.r.now() + 2);
        }
        let w = a.malloc(CHUNK);
        at.lock().unwrap().insert(w, 150);
        a.write(w, &pattern(99, 256)); // a fault-in: one victim
        let front = *busy.last().unwrap();
        let got = (resident(&a, front), resident(&a, x), ran.load(Relaxed));
        assert!(
            resident(&a, y) && resident(&a, z1) && resident(&a, z2),
            "y, z1, z2 stay (front, x, ran: {got:?})"
        );
        a.f.drain();
        // the queued work ran: the front is idle now and the next fault-in
        // takes it (the busy run the last scan kept is stale: taken as it
        // was, the scan would start behind the front and find nothing it
        // may take; the write then fails for want of HBM)
        let w2 = a.malloc(CHUNK);
        at.lock().unwrap().insert(w2, 151);
        a.write(w2, &pattern(98, 256));
        assert!(!resident(&a, front), "the front, idle now, leaves");
        assert!(resident(&a, y) && resident(&a, z1) && resident(&a, z2));
        for (k, &va) in busy.iter().chain(&[x, y, z1, z2]).enumerate() {
            assert_eq!(a.read(va, 256), pattern(k as u64, 256), "chunk {k}");
        }
        assert_eq!(a.read(w, 256), pattern(99, 256));
        assert_eq!(a.read(w2, 256), pattern(98, 256));
        a.assert_clean();
        got
    };
    // (x's next use, a copy-in in flight) -> (front, x, the operator ran)
    let cases = [
        // x predicted at 1000 (the busy front at 1075): x leaves, no wait
        (
            (1000, true),
            (true, false, false),
            "x near the front: taken",
        ),
        // x needed at 200: the fault-in waits for the copy-in, then x
        // leaves; the front's operator is still queued
        (
            (200, true),
            (true, false, false),
            "x needed soon, a copy-in in flight: taken after it, no drain",
        ),
        // the same with the link idle: x leaves, no wait
        (
            (200, false),
            (true, false, false),
            "x needed soon, the link idle: taken",
        ),
        // every idle one needed inside the look-ahead window: the fault-in
        // waits for the front's use, and the front leaves
        (
            (0, true),
            (false, true, true),
            "x needed within the window: kept, the front waited for",
        ),
    ];
    for ((x_next, busy_link), want, what) in cases {
        assert_eq!(run(x_next, busy_link), want, "{what}");
    }
}

/// Makes device 0's latest copy-in read as in flight (`Dev::last_in`): an
/// event recorded behind work the lazy fake runs only when waited for.
fn copy_in_in_flight(a: &App) {
    let s = a.f.create_stream().unwrap();
    a.f.app_launch(s, "in flight", vec![], Box::new(|_m: &mut Mem<'_>| {}))
        .unwrap();
    let ev = a.f.create_event().unwrap();
    a.f.record_event(ev, s).unwrap();
    assert!(!a.f.event_done(ev).unwrap());
    let mut st = a.r.shard_of(0).st.lock().unwrap();
    *st.event_refs.entry(ev).or_insert(0) += 1;
    let old = std::mem::replace(&mut st.dev_mut(0).last_in, ev);
    if old != 0 {
        st.unref_event(old);
    }
}

/// Demand eviction when every candidate is busy: the fault-in waits (with
/// no lock held) for the busy candidate last used earliest, whose use the
/// device reaches first, when the policy's best victim was last used later.
/// An operator reads x, y and z; then `gap` operators on the same stream
/// read f, the policy's front (needed furthest). The wait runs the first
/// operator only (the lazy fake runs a stream up to the event waited for),
/// and x, the best of the now idle chunks, leaves while f stays, its
/// operators still queued; waiting for the front instead ran them all and
/// evicted f (13B AdamW at 1.5 x HBM: the optimizer's first update, queued
/// behind the backward, was waited for while the backward's activations
/// went idle) — so with a gap of 2 as of 40 (a fence round apart: once the
/// only case). The front leaves when x is needed much sooner than f (under
/// half its weighted distance to its next use, `DIRTY_SHARE`) — unless f
/// is dead (written whole before any read: `next_use` u64::MAX), which has
/// no distance to weigh x against: then x leaves however soon it is needed.
#[test]
fn a_fault_in_with_every_victim_busy_waits_for_the_one_used_earliest() {
    let run_dead = |gap: usize, x_next: u64, f_next: u64| {
        let (policy, at) = Script::new();
        let a = App::with_policy(4, Box::new(policy));
        a.r.set_look_ahead(false);
        let (f, x, y, z) = (
            a.malloc(CHUNK),
            a.malloc(CHUNK),
            a.malloc(CHUNK),
            a.malloc(CHUNK),
        );
        at.lock()
            .unwrap()
            .extend([(f, f_next), (x, x_next), (y, 100), (z, 101)]);
        for (k, &va) in [f, x, y, z].iter().enumerate() {
            a.write(va, &pattern(k as u64, 256)); // HBM full: 4 chunks
        }
        let s = a.f.app_stream();
        let nop = || Box::new(|_m: &mut Mem<'_>| {}) as Kernel;
        a.op(s, &[(x, CHUNK), (y, CHUNK), (z, CHUNK)], &[], nop());
        // calls on a stream share one use fence until something records
        // it: record it here, so the first operator completes on its own
        a.r.before_capture(s);
        for _ in 0..gap {
            a.op(s, &[(f, CHUNK)], &[], nop());
        }
        let w = a.malloc(CHUNK);
        at.lock().unwrap().insert(w, 150);
        a.write(w, &pattern(99, 256)); // a fault-in: every candidate busy
        let got = (resident(&a, f), resident(&a, x));
        assert!(resident(&a, y) && resident(&a, z));
        a.f.drain();
        for (k, &va) in [f, x, y, z].iter().enumerate() {
            assert_eq!(a.read(va, 256), pattern(k as u64, 256), "chunk {k}");
        }
        assert_eq!(a.read(w, 256), pattern(99, 256));
        a.assert_clean();
        got
    };
    let run = |gap: usize, x_next: u64| run_dead(gap, x_next, 1000);
    assert_eq!(run(40, 900), (true, false), "a fence round apart: x leaves");
    assert_eq!(run(2, 900), (true, false), "close: x leaves too");
    assert_eq!(
        run(40, 200),
        (false, true),
        "x needed soon: the front leaves"
    );
    assert_eq!(
        run_dead(40, 200, u64::MAX),
        (true, false),
        "x needed soon, the front dead: x leaves, the front's work stays queued"
    );
}

/// The same wait when the scan resumes a busy run an earlier scan kept
/// (`BusyFront`: the next scan of the order starts behind the run). The
/// run's first chunk f is the policy's front, last used by the newest
/// work; x, behind it in the run, by the oldest. The first fault-in takes
/// the idle v behind the run and keeps the run; the second finds every
/// candidate behind it busy too, and waits for x's work (x leaves, f's
/// work stays queued), as a scan from the front would. When the resumed
/// run stood for its first chunk alone, the wait was for f, the newest
/// work, draining the device's queue (the 8-layer LoRA at 1.5 x HBM under
/// a scratch victim order, as its backward began: every chunk busy, a 45
/// ms wait for work 26 calls old with work 256 calls old still queued in
/// the run).
#[test]
fn a_resumed_busy_run_waits_for_the_work_used_earliest_in_it() {
    let (mut policy, at) = Script::new();
    policy.ttl = 1000; // the order is kept between the two fault-ins
    let a = App::with_policy(5, Box::new(policy));
    a.r.set_look_ahead(false);
    let [f, x, v, y, z] = [(); 5].map(|_| a.malloc(CHUNK));
    at.lock()
        .unwrap()
        .extend([(f, 1000), (x, 900), (v, 800), (y, 100), (z, 101)]);
    for (k, &va) in [f, x, v, y, z].iter().enumerate() {
        a.write(va, &pattern(k as u64, 256)); // HBM full: 5 chunks
    }
    let s = a.f.app_stream();
    let nop = || Box::new(|_m: &mut Mem<'_>| {}) as Kernel;
    a.op(s, &[(x, CHUNK), (y, CHUNK), (z, CHUNK)], &[], nop());
    a.r.before_capture(s); // its own fence: it completes on its own
    for _ in 0..40 {
        a.op(s, &[(f, CHUNK)], &[], nop());
    }
    let w1 = a.malloc(CHUNK);
    at.lock().unwrap().insert(w1, 150);
    a.write(w1, &pattern(98, 256)); // the first fault-in: v leaves
    assert!(!resident(&a, v) && resident(&a, f) && resident(&a, x));
    let w2 = a.malloc(CHUNK);
    at.lock().unwrap().insert(w2, 151);
    a.write(w2, &pattern(99, 256)); // the second: every candidate busy
    assert!(resident(&a, f), "f's work, the newest, stays queued");
    assert!(!resident(&a, x), "x's work, the oldest, is waited for");
    a.f.drain();
    for (k, &va) in [f, x, v, y, z].iter().enumerate() {
        assert_eq!(a.read(va, 256), pattern(k as u64, 256), "chunk {k}");
    }
    assert_eq!(a.read(w1, 256), pattern(98, 256));
    assert_eq!(a.read(w2, 256), pattern(99, 256));
    a.assert_clean();
}

/// Demand eviction behind a busy group larger than the kept order
/// (`ORDER_TOP`, 1024) and than `SCAN_FAR` (1024): one operator reads 1,040
/// chunks (one event), the policy's furthest; behind them in the order, x
/// is idle and needed about as late (`FAR_SHARE`). The order is built
/// deeper (`ORDER_DEEP`) when all of it is busy, and the busy group counts
/// once against `SCAN_FAR`: x leaves and the fault-in does not wait for
/// the operator. Without either, the scan stopped in the busy group and the
/// fault-in waited for the operator and evicted its first chunk (13B AdamW
/// at 1.5 x HBM: the optimizer's first fault-ins behind ~1,400 busy ones).
/// x needed much sooner than the group is taken too — so far behind, the
/// device would drain its queue before the wait ended (`SCAN_WAIT`) —
/// and behind 100 busy ones, once u3m's copy-in in flight has landed (the
/// wait is for that, not for the operator, which stays queued).
/// Returns (front resident, x resident, the busy operator ran).
#[test]
fn a_fault_in_reaches_past_a_busy_group_larger_than_the_kept_order() {
    let run = |nbusy: usize, x_far: bool, busy_link: bool| {
        let (mut policy, at) = Script::new();
        policy.top = true;
        let a = App::with_policy(nbusy as u64 + 2, Box::new(policy));
        a.r.set_look_ahead(false);
        let busy: Vec<u64> = (0..nbusy).map(|_| a.malloc(CHUNK)).collect();
        let (x, y) = (a.malloc(CHUNK), a.malloc(CHUNK));
        {
            let mut at = at.lock().unwrap();
            for (k, &b) in busy.iter().enumerate() {
                at.insert(b, 20_010 + k as u64); // the last is the front
            }
            let x_next = if x_far { 20_005 } else { 6_000 };
            at.extend([(x, x_next), (y, 5_000)]);
        }
        for (k, &va) in busy.iter().chain(&[x, y]).enumerate() {
            a.write(va, &pattern(k as u64, 256)); // HBM full
        }
        let s = a.f.app_stream();
        let ins: Vec<(u64, u64)> = busy.iter().map(|&b| (b, CHUNK)).collect();
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r2 = ran.clone();
        a.op(
            s,
            &ins,
            &[],
            Box::new(move |_m: &mut Mem<'_>| r2.store(true, Relaxed)),
        );
        if busy_link {
            copy_in_in_flight(&a);
        }
        let w = a.malloc(CHUNK);
        at.lock().unwrap().insert(w, 4_000);
        a.write(w, &pattern(99, 256)); // a fault-in: one victim
        let front = *busy.last().unwrap();
        let got = (resident(&a, front), resident(&a, x), ran.load(Relaxed));
        assert!(resident(&a, y));
        a.f.drain();
        for (k, &va) in busy.iter().chain(&[x, y]).enumerate() {
            assert_eq!(a.read(va, 256), pattern(k as u64, 256), "chunk {k}");
        }
        assert_eq!(a.read(w, 256), pattern(99, 256));
        a.assert_clean();
        got
    };
    assert_eq!(
        run(1040, true, true),
        (true, false, false),
        "x behind the busy group: taken"
    );
    assert_eq!(
        run(1040, false, true),
        (true, false, false),
        "x needed soon behind 1,040 busy: taken"
    );
    assert_eq!(
        run(100, false, true),
        (true, false, false),
        "x needed soon behind 100 busy: taken once the copy-in landed, no drain"
    );
    assert_eq!(
        run(100, false, false),
        (true, false, false),
        "x needed soon behind 100 busy, the link idle: taken"
    );
}

/// A demand eviction's scan asks each pending event once, also past the
/// `BUSY_EVENTS` (32) it keeps: behind 40 busy chunks on 40 streams, 150
/// chunks one call used (one event) were each asked again, 150 "not
/// complete" answers for one event at one host time — a program spinning
/// on it, to the simulator, which then moved the host's time to the
/// event's and so parted from `u3m replay` (8-layer 13B LoRA, SCAN_WAIT:
/// 14.4 % in bytes).
#[test]
fn a_deep_scan_asks_each_pending_event_once() {
    let (nsolo, ngroup) = (40usize, 150usize);
    let (mut policy, at) = Script::new();
    policy.top = true;
    let a = App::with_policy((nsolo + ngroup) as u64, Box::new(policy));
    a.r.set_look_ahead(false);
    let solo: Vec<u64> = (0..nsolo).map(|_| a.malloc(CHUNK)).collect();
    let group: Vec<u64> = (0..ngroup).map(|_| a.malloc(CHUNK)).collect();
    {
        let mut at = at.lock().unwrap();
        // the solo ones at the front of the order, the group behind them
        for (k, &c) in solo.iter().enumerate() {
            at.insert(c, 40_000 + k as u64);
        }
        for (k, &c) in group.iter().enumerate() {
            at.insert(c, 20_000 + k as u64);
        }
    }
    for (k, &va) in solo.iter().chain(&group).enumerate() {
        a.write(va, &pattern(k as u64, 256)); // HBM full
    }
    for &c in &solo {
        let s = a.f.create_stream().unwrap();
        a.op(s, &[(c, CHUNK)], &[], Box::new(|_m: &mut Mem<'_>| {}));
    }
    let s = a.f.app_stream();
    let ins: Vec<(u64, u64)> = group.iter().map(|&c| (c, CHUNK)).collect();
    a.op(s, &ins, &[], Box::new(|_m: &mut Mem<'_>| {}));
    let w = a.malloc(CHUNK);
    at.lock().unwrap().insert(w, 4_000);
    a.write(w, &pattern(999, 256)); // a fault-in with every victim busy
    let seen = a.f.seen();
    let most = seen.pending_answers.values().max().copied().unwrap_or(0);
    assert!(
        seen.pending_answers.len() >= 33,
        "{:?}",
        seen.pending_answers
    );
    assert!(most <= 4, "one event answered 'not complete' {most} times");
    a.f.drain();
    for (k, &va) in solo.iter().chain(&group).enumerate() {
        assert_eq!(a.read(va, 256), pattern(k as u64, 256), "chunk {k}");
    }
    assert_eq!(a.read(w, 256), pattern(999, 256));
    a.assert_clean();
}

/// Demand eviction behind a busy front of fewer than 64 candidates, the
/// front clean (RAG: the KV queued decode work reads is predicted furthest).
/// A dirty idle chunk among the nearest `DIRTY_NEAR` (16; 36 before
/// operators' whole writes) is taken whatever its next use; one further
/// back (within 64) only if its weighted distance to its next use is at
/// least half the clean front's (needed no sooner than it): a dirty chunk
/// behind 20 busy clean ones and needed much
/// sooner is kept, and the fault-in waits for the front (without the lock)
/// instead. Taking it — the rule when any idle one of the first 64 went —
/// costs a copy-out and a fetch MIN does not make; on kv_decode 1436.5
/// tokens/s, 1545.7 with this rule (simulated). Behind a dirty front (an
/// optimizer's just-written state) the rule does not apply.
#[test]
fn an_idle_victim_needed_soon_behind_twenty_busy_ones_is_kept() {
    // (front resident, x resident) after one fault-in, with `nbusy` busy
    // chunks (clean: copied out and read back, or dirty) in front of x in
    // the order and x (dirty) predicted at tick `x_next`
    let run = |nbusy: usize, x_next: u64, clean_front: bool| {
        let (mut policy, at) = Script::new();
        policy.ttl = 0; // the order built for each eviction
        let a = App::with_policy(nbusy as u64 + 4, Box::new(policy));
        a.r.set_look_ahead(false);
        let busy: Vec<u64> = (0..nbusy).map(|_| a.malloc(CHUNK)).collect();
        let (x, y, z1, z2) = (
            a.malloc(CHUNK),
            a.malloc(CHUNK),
            a.malloc(CHUNK),
            a.malloc(CHUNK),
        );
        {
            let mut at = at.lock().unwrap();
            for (k, &b) in busy.iter().enumerate() {
                at.insert(b, 1010 + k as u64); // the last is the front
            }
            // (x's own next use once the busy ones are set up)
            at.extend([(x, 200), (y, 100), (z1, 101), (z2, 102)]);
        }
        for (k, &va) in busy.iter().chain(&[x, y, z1, z2]).enumerate() {
            a.write(va, &pattern(k as u64, 256)); // HBM full
        }
        if clean_front {
            // the busy ones (furthest) leave with their data, come back clean
            assert!(a.r.make_room(0, nbusy as u64 * CHUNK).is_some());
            for (k, &va) in busy.iter().enumerate() {
                assert_eq!(a.read(va, 256), pattern(k as u64, 256));
            }
            assert!(resident(&a, x) && resident(&a, *busy.last().unwrap()));
        }
        at.lock().unwrap().insert(x, x_next);
        let s = a.f.app_stream();
        let ins: Vec<(u64, u64)> = busy.iter().map(|&b| (b, CHUNK)).collect();
        a.op(s, &ins, &[], Box::new(|_m: &mut Mem<'_>| {}));
        let w = a.malloc(CHUNK);
        at.lock().unwrap().insert(w, 150);
        a.write(w, &pattern(99, 256)); // a fault-in: one victim
        let front = *busy.last().unwrap();
        let got = (resident(&a, front), resident(&a, x));
        assert!(resident(&a, y) && resident(&a, z1) && resident(&a, z2));
        a.f.drain();
        for (k, &va) in busy.iter().chain(&[x, y, z1, z2]).enumerate() {
            assert_eq!(a.read(va, 256), pattern(k as u64, 256), "chunk {k}");
        }
        assert_eq!(a.read(w, 256), pattern(99, 256));
        a.assert_clean();
        got
    };
    // behind 10 busy clean ones (within the nearest 16): x is taken, no wait
    assert_eq!(
        run(10, 200, true),
        (true, false),
        "x among the nearest: taken"
    );
    // behind 20: x, needed at 200 against the front's 1029, stays; the
    // fault-in waits for the front, which leaves
    assert_eq!(
        run(20, 200, true),
        (false, true),
        "x behind 20 busy, needed soon: kept"
    );
    // behind 20 but needed after the front (half its weighted distance)
    assert_eq!(
        run(20, 1500, true),
        (true, false),
        "x behind 20 busy, needed after the front: taken"
    );
    // behind 20 dirty busy ones: as before, taken
    assert_eq!(
        run(20, 200, false),
        (true, false),
        "x behind a dirty front: taken"
    );
}

/// Where chunk 0 of the allocation at `va` on device 0 keeps its host
/// copy: "dram", "nvme" or "none".
fn host_of(r: &Residency, va: u64) -> &'static str {
    let st = r.shard_of(0).st.lock().unwrap();
    let (id, i) = st.resolve(va).expect("managed");
    match st.chunk(id, i).host {
        Some(state::Host::Dram(_)) => "dram",
        Some(state::Host::Nvme(_)) => "nvme",
        None => "none",
    }
}

/// A 1-device residency on the fake (copies run only when waited for)
/// with `hbm` chunks of HBM and the residency config `vars`.
fn lazy_rig(hbm: u64, vars: &[(&str, &str)]) -> (&'static Fake, &'static Residency) {
    let f = Fake::leak(1, hbm * CHUNK);
    f.set_per_thread_device();
    let r: &'static Residency = Box::leak(Box::new(
        Residency::new(f, &config(vars)).expect("residency"),
    ));
    (f, r)
}

/// Issue 10 part 2 (branch nolock2): a copy-in from NVMe goes through a
/// staging buffer of its own (the device's pool, `take_staging`), where a
/// single shared buffer was waited for — u3m's stream synchronised with the
/// device's lock held — before every NVMe read. Here a reader's copy-in of
/// an NVMe chunk is held inside the runtime (the lazy fake: it has not
/// run): the device's lock is free, and another thread on the device
/// faults two more NVMe chunks in through other staging buffers and reads
/// their bytes; the held copy then lands its own. On the old code the first
/// held wait is that staging sync, lock held.
#[test]
fn an_nvme_copy_in_waits_for_no_staging_buffer_with_the_lock_held() {
    let dir = SwapDir::new("nvme-staging");
    let d = dir.0.display().to_string();
    let (f, r) = lazy_rig(
        2,
        &[
            ("U3M_DRAM_BYTES", "4M"),
            ("U3M_SWAP_DIR", &d),
            ("U3M_SWAP_BYTES", "64M"),
        ],
    );
    let call = |va: u64, data: Option<&[u8]>| -> Vec<u8> {
        sync_call(r, f, 0, va, CHUNK, data).expect("call")
    };
    let (free, total) = f.mem_info().unwrap();
    let vas: Vec<u64> = (0..5)
        .map(|_| r.malloc(0, CHUNK, free, total).unwrap().unwrap())
        .collect();
    for (k, &va) in vas.iter().enumerate() {
        call(va, Some(&pattern(40 + k as u64, CHUNK)));
    }
    assert!(r.make_room(0, 2 * CHUNK).is_some(), "all evicted");
    f.drain();
    let nv: Vec<(u64, u64)> = vas
        .iter()
        .enumerate()
        .filter(|&(_, &va)| host_of(r, va) == "nvme")
        .map(|(k, &va)| (va, 40 + k as u64))
        .collect();
    assert!(nv.len() >= 3, "chunks on NVMe: {}", nv.len());
    let waits_before = f.seen().locked_waits;
    f.hold_waits(1);
    let (x, sx) = nv[0];
    let reader = std::thread::spawn(move || call(x, None));
    assert_eq!(f.waits_held(10_000), 1, "the reader waits for x's copy-in");
    let st = r.shard_of(0).st.try_lock();
    assert!(st.is_ok(), "the device's lock is free during the wait");
    drop(st);
    // x's staging buffer is still being read: the others get their own
    let (y, sy) = nv[1];
    let (z, sz) = nv[2];
    let other = std::thread::spawn(move || {
        assert_eq!(call(y, None), pattern(sy, CHUNK));
        // (z's room: y's HBM, never x's, arriving)
        assert_eq!(call(z, None), pattern(sz, CHUNK));
        assert_eq!(call(y, None), pattern(sy, CHUNK));
    });
    other.join().expect("the other thread");
    f.release_waits();
    assert_eq!(reader.join().expect("reader"), pattern(sx, CHUNK));
    for (k, &va) in vas.iter().enumerate() {
        assert_eq!(call(va, None), pattern(40 + k as u64, CHUNK), "alloc {k}");
    }
    let s = f.seen();
    assert_eq!(
        s.locked_waits, waits_before,
        "host waits with the lock held"
    );
    assert_no_misuse_or_fault(&s);
    let c = r.counters();
    assert!(c.from_nvme >= 3 && c.spill_errors == 0, "{c:?}");
    for va in vas {
        assert_eq!(r.free(va), Some(Ok(())));
    }
    r.finalize();
    f.drain();
    assert_eq!(
        f.held(),
        (0, 0),
        "handles / pinned host bytes (staging) left"
    );
}

/// Issue 10 part 2 (branch nolock2): a dirty chunk's copy-out to NVMe is
/// asynchronous like one to DRAM — into a staging buffer of its own on
/// u3m's device-to-host stream, written out to its NVMe slot when it has
/// landed (`harvest`) — where it was waited for with the device's lock
/// held. A writer needing the HBM waits for it without the lock (held
/// inside the runtime here); meanwhile another thread takes the leaving
/// chunk back (rescue) and reads both resident chunks; the writer then
/// evicts again and every byte is where it belongs. On the old code the
/// held wait is the copy-out's stream sync, lock held.
#[test]
fn an_nvme_copy_out_is_waited_for_without_the_lock() {
    let dir = SwapDir::new("nvme-out");
    let d = dir.0.display().to_string();
    let (f, r) = lazy_rig(
        2,
        &[
            ("U3M_DRAM_BYTES", "4M"),
            ("U3M_SWAP_DIR", &d),
            ("U3M_SWAP_BYTES", "64M"),
        ],
    );
    let call = |va: u64, data: Option<&[u8]>| -> Vec<u8> {
        sync_call(r, f, 0, va, CHUNK, data).expect("call")
    };
    let (free, total) = f.mem_info().unwrap();
    let m = || r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    // DRAM at its 95 % mark: a and b out, one in DRAM, one on NVMe
    let (a, b) = (m(), m());
    call(a, Some(&pattern(1, CHUNK)));
    call(b, Some(&pattern(2, CHUNK)));
    assert!(r.make_room(0, 2 * CHUNK).is_some());
    f.drain();
    // x and y fill HBM, dirty, with no host copy
    let (x, y, z) = (m(), m(), m());
    call(x, Some(&pattern(3, CHUNK)));
    call(y, Some(&pattern(4, CHUNK)));
    let waits_before = f.seen().locked_waits;
    let nvme_before = r.counters().to_nvme;
    f.hold_waits(1);
    // z's room: x (least recent) leaves for NVMe
    let writer = std::thread::spawn(move || call(z, Some(&pattern(5, CHUNK))));
    assert_eq!(f.waits_held(10_000), 1, "the writer waits for x's copy-out");
    let st = r.shard_of(0).st.try_lock();
    assert!(st.is_ok(), "the device's lock is free during the wait");
    drop(st);
    {
        let st = r.shard_of(0).st.lock().unwrap();
        let (id, i) = st.resolve(x).unwrap();
        assert!(st.chunk(id, i).out_ev != 0, "x is leaving");
        assert_eq!(st.dev(0).outgoing.len(), 1);
        assert!(
            st.dev(0).outgoing[0].staging != 0,
            "x leaves through staging"
        );
    }
    // another thread takes x back while its copy-out is in flight
    let other = std::thread::spawn(move || {
        assert_eq!(call(x, None), pattern(3, CHUNK));
        assert_eq!(call(y, None), pattern(4, CHUNK));
    });
    other.join().expect("the other thread");
    f.release_waits();
    writer.join().expect("writer");
    for (va, seed) in [(a, 1), (b, 2), (x, 3), (y, 4), (z, 5), (x, 3)] {
        assert_eq!(call(va, None), pattern(seed, CHUNK), "{va:#x}");
    }
    let c = r.counters();
    assert!(c.rescued >= 1, "x taken back: {c:?}");
    assert!(c.to_nvme > nvme_before && c.spill_errors == 0, "{c:?}");
    let s = f.seen();
    assert_eq!(
        s.locked_waits, waits_before,
        "host waits with the lock held"
    );
    assert_no_misuse_or_fault(&s);
    for va in [a, b, x, y, z] {
        assert_eq!(r.free(va), Some(Ok(())));
    }
    r.finalize();
    f.drain();
    assert_eq!(
        f.held(),
        (0, 0),
        "handles / pinned host bytes (staging) left"
    );
}

/// Issue 10 part 2 (branch nolock2): DRAM full, no NVMe — a dirty victim's
/// copy-out takes the DRAM of clean copies of resident chunks
/// (`drop_duplicates`), which a copy-in still queued on u3m's stream reads.
/// They come back behind a fence on that stream, and the call needing the
/// DRAM waits for the fence without the lock (where `reclaim_wait`
/// synchronised the stream with it held). Meanwhile another thread reads
/// a chunk whose copy-in is queued and gets its bytes.
#[test]
fn dram_full_waits_for_the_duplicates_it_drops_without_the_lock() {
    let (f, r) = lazy_rig(3, &[("U3M_DRAM_BYTES", "4M")]);
    let call = |va: u64, data: Option<&[u8]>| -> Vec<u8> {
        sync_call(r, f, 0, va, CHUNK, data).expect("call")
    };
    let (free, total) = f.mem_info().unwrap();
    let m = || r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let (a, b, c, d) = (m(), m(), m(), m());
    // a and b to DRAM: it is full (two chunks)
    call(a, Some(&pattern(1, CHUNK)));
    call(b, Some(&pattern(2, CHUNK)));
    assert!(r.make_room(0, 3 * CHUNK).is_some());
    f.drain();
    assert_eq!(r.usage(0).1, 4 * MIB);
    // c: dirty, no host copy, least recently used
    call(c, Some(&pattern(3, CHUNK)));
    // a and b come back for an operator: their copy-ins queued (lazy fake),
    // clean, their DRAM copies duplicates
    let s = f.app_stream();
    let tok = r
        .prepare(
            0,
            OpClass::Elementwise as u8,
            &[
                Range {
                    addr: a,
                    len: CHUNK,
                    write: false,
                    whole: false,
                },
                Range {
                    addr: b,
                    len: CHUNK,
                    write: false,
                    whole: false,
                },
            ],
            false,
            Order::Stream(s),
        )
        .expect("prepare");
    f.app_launch(
        s,
        "read a b",
        vec![(a, CHUNK), (b, CHUNK)],
        Box::new(|_m: &mut Mem<'_>| {}),
    )
    .unwrap();
    r.finish(tok, Some(s), true);
    assert_eq!(host_of(r, a), "dram");
    let waits_before = f.seen().locked_waits;
    f.hold_waits(1);
    // d's room: c leaves, its DRAM from a's and b's duplicates
    let writer = std::thread::spawn(move || call(d, Some(&pattern(4, CHUNK))));
    assert_eq!(f.waits_held(10_000), 1, "the writer waits");
    let st = r.shard_of(0).st.try_lock();
    assert!(st.is_ok(), "the device's lock is free during the wait");
    drop(st);
    assert_eq!(host_of(r, a), "none", "a's duplicate dropped");
    let other = std::thread::spawn(move || assert_eq!(call(a, None), pattern(1, CHUNK)));
    other.join().expect("the other thread");
    f.release_waits();
    writer.join().expect("writer");
    for (va, seed) in [(a, 1), (b, 2), (c, 3), (d, 4), (a, 1), (b, 2)] {
        assert_eq!(call(va, None), pattern(seed, CHUNK), "{va:#x}");
    }
    let seen = f.seen();
    assert_eq!(
        seen.locked_waits, waits_before,
        "host waits with the lock held"
    );
    assert!(seen.misuse.is_empty(), "misuse: {:#?}", seen.misuse);
    assert!(seen.faults.is_empty(), "faults: {:#?}", seen.faults);
    for va in [a, b, c, d] {
        assert_eq!(r.free(va), Some(Ok(())));
    }
    assert_eq!(r.usage(0), (0, 0, 0));
}

/// `reclaim` gives back every device's deferred host slots, not only the
/// calling thread's device's: `Fenced` records the fence on the slot's
/// device's u3m stream whichever thread asks (branch nolock2 removed the
/// `cur != d` skip). A device-0 thread overwrites a device-1 chunk whose
/// old DRAM copy is then deferred, and a later eviction on device 1 from
/// the same thread gives it back; nothing misuses the runtime (a record on
/// another device's stream would). On the old code the slot stays
/// deferred until a device-1 thread reclaims.
#[test]
fn reclaim_gives_back_another_devices_deferred_slots() {
    let f = Fake::leak(2, 2 * CHUNK);
    f.set_per_thread_device();
    f.set_eager(true);
    let r = Residency::new(f, &config(&[])).expect("residency");
    let (free, total) = f.mem_info().unwrap();
    f.set_device(1).unwrap();
    let m = || r.malloc(1, CHUNK, free, total).unwrap().unwrap();
    let (x, y, z) = (m(), m(), m());
    for (va, seed) in [(x, 1), (y, 2), (z, 3)] {
        sync_call(&r, f, 1, va, CHUNK, Some(&pattern(seed, CHUNK))).unwrap();
    }
    assert!(r.make_room(1, 2 * CHUNK).is_some());
    assert_eq!(r.usage(1).0, 0, "all of device 1's chunks in DRAM");
    // device 0's thread from here on
    f.set_device(0).unwrap();
    sync_call(&r, f, 0, x, CHUNK, Some(&pattern(4, CHUNK))).unwrap();
    {
        let st = r.shard_of(1).st.lock().unwrap();
        assert!(st.dev(1).stream != 0, "device 1 has its u3m stream");
        assert_eq!(
            st.pending_free.iter().filter(|p| p.0 == 1).count() + st.fenced_free.len(),
            1,
            "x's old DRAM copy deferred"
        );
    }
    // y then z: HBM full, x (dirty) is evicted: a copy-out needs a host slot
    assert_eq!(
        sync_call(&r, f, 0, y, CHUNK, None).unwrap(),
        pattern(2, CHUNK)
    );
    assert_eq!(
        sync_call(&r, f, 0, z, CHUNK, None).unwrap(),
        pattern(3, CHUNK)
    );
    assert!(r.counters().evictions >= 4);
    {
        let st = r.shard_of(1).st.lock().unwrap();
        assert!(
            st.pending_free.is_empty() && st.fenced_free.is_empty(),
            "deferred slots left: {} pending, {} fenced",
            st.pending_free.len(),
            st.fenced_free.len()
        );
    }
    for (va, seed) in [(x, 4), (y, 2), (z, 3)] {
        assert_eq!(
            sync_call(&r, f, 0, va, CHUNK, None).unwrap(),
            pattern(seed, CHUNK)
        );
    }
    for va in [x, y, z] {
        assert_eq!(r.free(va), Some(Ok(())));
    }
    assert_eq!(r.usage(1), (0, 0, 0));
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
}

/// The two-device stress with DRAM at its 95 % mark from the first
/// eviction on and an NVMe tier taking the rest: copy-ins from NVMe
/// through staging buffers, copy-outs to NVMe, DRAM short. With copies run
/// only when waited for and as queued, no host wait is asked with a
/// residency lock held, finalize included (branch nolock2; on c326c81 the
/// staging buffer's and the NVMe copy-outs' stream syncs were).
#[test]
fn the_two_device_stress_on_nvme_waits_with_no_residency_lock_held() {
    let dir = SwapDir::new("stress-nvme");
    let d = dir.0.display().to_string();
    let vars = [
        ("U3M_DRAM_BYTES", "4M"),
        ("U3M_SWAP_DIR", d.as_str()),
        ("U3M_SWAP_BYTES", "128M"),
    ];
    for eager in [false, true] {
        let (s, c) = two_devices_stress_with(eager, &vars);
        assert!(c.to_nvme > 0 && c.from_nvme > 0, "eager {eager}: {c:?}");
        assert_eq!(c.spill_errors, 0, "eager {eager}: {c:?}");
        assert!(
            s.locked_waits.is_empty(),
            "eager {eager}: host waits with a residency lock held: {:?}",
            s.locked_waits
        );
    }
}

/// Issue 10 part 2 (branch nolock2): an export waits for the copy-out that
/// makes its room, and for its copy-in, without the device's lock
/// (`wait_unlocked`, `wait_copy_ins`), where `settle_outgoing` and
/// `fault_in` synchronised u3m's streams with it held. While the export's
/// wait is held inside the runtime, another thread takes the leaving chunk
/// back and reads both resident chunks; the export then evicts again and
/// every byte is where it belongs. On the old code the held wait is
/// settle_outgoing's, lock held. (`make_room` still settles with the lock
/// held: unlocked, other threads' fault-ins took the HBM it freed before
/// the unmanaged allocation's retry — hostmap_stream's mt_stress failed
/// 3 times in 6.)
#[test]
fn an_export_waits_for_its_copy_outs_without_the_lock() {
    let (f, r) = lazy_rig(2, &[]);
    let call = |va: u64, data: Option<&[u8]>| -> Vec<u8> {
        sync_call(r, f, 0, va, CHUNK, data).expect("call")
    };
    let (free, total) = f.mem_info().unwrap();
    let m = || r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let (x, y) = (m(), m());
    let h = r.malloc_physical(0, CHUNK, false).unwrap().unwrap();
    let va = f.reserve(CHUNK).unwrap();
    assert_eq!(r.map(va, CHUNK, 0, h), Some(Ok(())));
    call(va, Some(&pattern(5, CHUNK)));
    call(x, Some(&pattern(3, CHUNK)));
    // h (least recent) leaves, its data with it (a VMM handle's copy-out:
    // still waited for with the lock held)
    call(y, Some(&pattern(4, CHUNK)));
    assert_eq!(r.usage(0).0, 2 * CHUNK);
    f.drain();
    let waits_before = f.seen().locked_waits;
    f.hold_waits(1);
    let export = std::thread::spawn(move || r.export(h));
    assert_eq!(f.waits_held(10_000), 1, "the export waits for x's copy-out");
    let st = r.shard_of(0).st.try_lock();
    assert!(st.is_ok(), "the device's lock is free during the wait");
    drop(st);
    let other = std::thread::spawn(move || {
        assert_eq!(call(x, None), pattern(3, CHUNK));
        assert_eq!(call(y, None), pattern(4, CHUNK));
    });
    other.join().expect("the other thread");
    f.release_waits();
    let got = export.join().expect("export");
    assert!(got.expect("u3m's handle").is_ok(), "exported");
    assert_eq!(f.seen().locked_waits, waits_before, "export's waits");
    for (v, seed) in [(va, 5), (x, 3), (y, 4)] {
        assert_eq!(call(v, None), pattern(seed, CHUNK), "{v:#x}");
    }
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
    assert!(r.counters().rescued >= 1);
}

/// An operator's ranges: `ins` read, `outs` written.
fn op_ranges(ins: &[(u64, u64)], outs: &[(u64, u64)]) -> Vec<Range> {
    let r = |write| {
        move |&(addr, len): &(u64, u64)| Range {
            addr,
            len,
            write,
            whole: false,
        }
    };
    ins.iter()
        .map(r(false))
        .chain(outs.iter().map(r(true)))
        .collect()
}

/// A stream-ordered operator on device 0 from any thread: reads `ins`,
/// writes `outs` when it runs on `s` (prepare, launch, finish).
fn stream_op(
    r: &Residency,
    f: &Fake,
    s: u64,
    ins: &[(u64, u64)],
    outs: &[(u64, u64)],
    k: Kernel,
) -> Result<(), AclError> {
    let ranges = op_ranges(ins, outs);
    let tok = r.prepare(
        0,
        OpClass::Elementwise as u8,
        &ranges,
        false,
        Order::Stream(s),
    )?;
    let all = ins.iter().chain(outs).copied().collect();
    let rc = f.app_launch(s, "op", all, k);
    r.finish(tok, Some(s), rc.is_ok());
    rc
}

/// x and y of 10 MiB each on an 8-chunk device (host mapping on), both
/// written and the device caught up.
fn host_map_rig() -> (&'static Fake, &'static Residency, u64, u64, Vec<u8>) {
    let (f, r) = lazy_rig(8, &[("U3M_HOST_MAP", "auto")]);
    let (free, total) = f.mem_info().unwrap();
    let x = r.malloc(0, 10 * MIB, free, total).unwrap().unwrap();
    let y = r.malloc(0, 10 * MIB, free, total).unwrap().unwrap();
    let px = pattern(1, 10 * MIB);
    sync_call(r, f, 0, x, 10 * MIB, Some(&px)).unwrap();
    sync_call(r, f, 0, y, 10 * MIB, Some(&pattern(2, 10 * MIB))).unwrap();
    f.drain();
    (f, r, x, y, px)
}

/// Issue 10 part 2 (branch nolock3): host mapping moves a chunk between
/// HBM and a host handle with a remap and a copy queued on u3m's stream —
/// a use of the chunk that calls order themselves after — where the copy
/// was waited for with the device's lock held (`copy_chunk_into`, and
/// `map_to_host`'s stream sync for the fills). A call larger than HBM runs
/// host-mapped, both tensors come back into HBM for reads that fit, with
/// copies run lazily and eagerly: no host wait with the lock held, every
/// byte where it belongs, every host handle, scratch VA mapping and HBM
/// chunk given back. (On 2d7a3f4 it fails at the locked-waits assertion:
/// `copy_chunk_into`'s and `map_to_host`'s stream syncs.)
#[test]
fn host_mapping_moves_chunks_with_no_wait_under_the_lock() {
    for eager in [false, true] {
        let (f, r, x, y, px) = host_map_rig();
        f.set_eager(eager);
        let before = f.seen().locked_waits;
        let s = f.app_stream();
        stream_op(
            r,
            f,
            s,
            &[(x, 10 * MIB)],
            &[(y, 10 * MIB)],
            add(x, y, 10 * MIB, 1),
        )
        .expect("the call runs host-mapped");
        let c = r.counters();
        assert!(c.host_maps > 0 && c.host_map_bytes > 0, "{c:?}");
        f.sync_stream(s).unwrap();
        assert_eq!(sync_call(r, f, 0, x, 10 * MIB, None).unwrap(), px, "x");
        let want: Vec<u8> = px.iter().map(|b| b.wrapping_add(1)).collect();
        assert_eq!(sync_call(r, f, 0, y, 10 * MIB, None).unwrap(), want, "y");
        assert!(r.counters().host_unmaps > 0);
        let seen = f.seen();
        assert_eq!(
            seen.locked_waits, before,
            "eager {eager}: host waits with the lock held"
        );
        assert!(seen.misuse.is_empty(), "misuse: {:#?}", seen.misuse);
        assert!(seen.faults.is_empty(), "faults: {:#?}", seen.faults);
        assert_eq!(r.free(x), Some(Ok(())));
        assert_eq!(r.free(y), Some(Ok(())));
        assert_eq!(f.seen().host_handles, 0, "host handles given back");
        assert_eq!((r.usage(0).0, r.host_mapped(0)), (0, 0));
        r.finalize();
        f.drain();
        assert_eq!(f.held(), (0, 0), "handles / pinned host bytes left");
        assert!(f.seen().misuse.is_empty());
    }
}

/// The race on the same chunks: the call larger than HBM waits (held
/// inside the runtime) for the copies that move its chunks to host
/// handles, without the lock; meanwhile another thread reads x — whose
/// chunks are moving — (it orders itself after the moves' copies and
/// brings them back into HBM), overwrites part of it and reads it again.
/// Released, the call maps again what it needs and runs on the new bytes:
/// nothing is lost either way. On 2d7a3f4 the held wait is
/// `copy_chunk_into`'s, lock held.
#[test]
fn a_chunk_moving_to_a_host_handle_is_used_by_another_thread_meanwhile() {
    let (f, r, x, y, px) = host_map_rig();
    let before = f.seen().locked_waits;
    let s = f.app_stream();
    f.hold_waits(1);
    let op = std::thread::spawn(move || {
        stream_op(
            r,
            f,
            s,
            &[(x, 10 * MIB)],
            &[(y, 10 * MIB)],
            add(x, y, 10 * MIB, 1),
        )
    });
    assert_eq!(f.waits_held(10_000), 1, "the call waits for its moves");
    let st = r.shard_of(0).st.try_lock();
    assert!(st.is_ok(), "the device's lock is free during the wait");
    let moving = st.map(|st| st.dev(0).moves.len()).unwrap_or(0);
    assert!(moving > 0, "moves in flight while the call waits");
    let other = std::thread::spawn(move || {
        assert_eq!(sync_call(r, f, 0, x, 10 * MIB, None).unwrap(), px, "x read");
        let p9 = pattern(9, 3 * MIB);
        sync_call(r, f, 0, x, 3 * MIB, Some(&p9)).unwrap();
        let mut px2 = px.clone();
        px2[..3 * MIB as usize].copy_from_slice(&p9);
        assert_eq!(
            sync_call(r, f, 0, x, 10 * MIB, None).unwrap(),
            px2,
            "x read again"
        );
        px2
    });
    let px2 = other.join().expect("the other thread");
    f.release_waits();
    op.join().expect("the call").expect("it runs host-mapped");
    f.sync_stream(s).unwrap();
    let want: Vec<u8> = px2.iter().map(|b| b.wrapping_add(1)).collect();
    assert_eq!(sync_call(r, f, 0, y, 10 * MIB, None).unwrap(), want, "y");
    assert_eq!(sync_call(r, f, 0, x, 10 * MIB, None).unwrap(), px2, "x");
    let seen = f.seen();
    assert_eq!(seen.locked_waits, before, "host waits with the lock held");
    assert!(seen.misuse.is_empty(), "misuse: {:#?}", seen.misuse);
    assert!(seen.faults.is_empty(), "faults: {:#?}", seen.faults);
    let c = r.counters();
    assert!(c.host_maps > 0 && c.host_unmaps > 0, "{c:?}");
    assert_eq!(r.free(x), Some(Ok(())));
    assert_eq!(r.free(y), Some(Ok(())));
    assert_eq!(f.seen().host_handles, 0, "host handles given back");
    assert_eq!((r.usage(0).0, r.host_mapped(0)), (0, 0));
}

/// A VMM handle of two chunks, one in DRAM and one resident, on a 4-chunk
/// device whose other memory was freed: room for a real handle of its size.
fn export_rig() -> (&'static Fake, &'static Residency, u64, u64) {
    let (f, r) = lazy_rig(4, &[]);
    let h = r.malloc_physical(0, 2 * CHUNK, false).unwrap().unwrap();
    let v = f.reserve(2 * CHUNK).unwrap();
    assert_eq!(r.map(v, 2 * CHUNK, 0, h), Some(Ok(())));
    sync_call(r, f, 0, v, 2 * CHUNK, Some(&pattern(2, 2 * CHUNK))).unwrap();
    // x and y take its HBM; freed, they leave room
    let (free, total) = f.mem_info().unwrap();
    let x = r.malloc(0, 2 * CHUNK, free, total).unwrap().unwrap();
    let y = r.malloc(0, 2 * CHUNK, free, total).unwrap().unwrap();
    sync_call(r, f, 0, x, 2 * CHUNK, Some(&pattern(3, 2 * CHUNK))).unwrap();
    sync_call(r, f, 0, y, 2 * CHUNK, Some(&pattern(4, 2 * CHUNK))).unwrap();
    assert_eq!(r.free(x), Some(Ok(())));
    assert_eq!(r.free(y), Some(Ok(())));
    // its second chunk back in HBM, the first in DRAM
    assert_eq!(
        sync_call(r, f, 0, v + CHUNK, CHUNK, None).unwrap(),
        pattern(2, 2 * CHUNK)[CHUNK as usize..]
    );
    f.drain();
    (f, r, h, v)
}

/// Issue 10 part 2 (branch nolock3): a multi-chunk export copies its
/// chunks into the real handle and waits for the copies without the lock
/// (`materialize`), where it synchronised u3m's stream with the lock held
/// (2 waits in the audit). On 2d7a3f4 it fails at the locked-waits
/// assertion.
#[test]
fn a_multi_chunk_export_waits_for_its_copies_without_the_lock() {
    let (f, r, h, v) = export_rig();
    let before = f.seen().locked_waits;
    let real = r.export(h).expect("u3m's handle").expect("exported");
    assert_ne!(real, h);
    assert_eq!(f.seen().locked_waits, before, "export's waits");
    assert_eq!(r.export(h), Some(Ok(real)), "made real once");
    assert_eq!(
        sync_call(r, f, 0, v, 2 * CHUNK, None).unwrap(),
        pattern(2, 2 * CHUNK)
    );
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
    assert_eq!(r.unmap(v), Some(Ok(())));
    assert_eq!(r.free_physical(h), Some(Ok(())));
    f.release(v).unwrap();
    r.finalize();
    f.drain();
    assert_eq!(f.held(), (0, 0), "handles / pinned host bytes left");
}

/// The race on the same chunk: while the export waits (held inside the
/// runtime) for its copies into the real handle, another thread writes
/// part of the handle's first chunk (in DRAM: faulted in, the write lands
/// after the export's copy read the DRAM copy) and reads it back. The
/// export sees the chunk used meanwhile, copies again, and the real handle
/// holds the write. On 2d7a3f4 the held wait is `materialize`'s, lock
/// held.
#[test]
fn a_write_during_an_exports_copies_ends_up_in_the_real_handle() {
    let (f, r, h, v) = export_rig();
    let before = f.seen().locked_waits;
    let copies = |s: &super::fake::Seen| s.h2d + s.d2d;
    let issued = copies(&f.seen());
    f.hold_waits(1);
    let export = std::thread::spawn(move || r.export(h));
    assert_eq!(f.waits_held(10_000), 1, "the export waits for its copies");
    let st = r.shard_of(0).st.try_lock();
    assert!(st.is_ok(), "the device's lock is free during the wait");
    drop(st);
    assert!(
        copies(&f.seen()) >= issued + 2,
        "both chunks' copies queued"
    );
    let mut want = pattern(2, 2 * CHUNK);
    let p7 = pattern(7, MIB);
    want[..MIB as usize].copy_from_slice(&p7);
    let w = want.clone();
    let other = std::thread::spawn(move || {
        sync_call(r, f, 0, v, MIB, Some(&p7)).unwrap();
        assert_eq!(sync_call(r, f, 0, v, 2 * CHUNK, None).unwrap(), w);
    });
    other.join().expect("the other thread");
    f.release_waits();
    let real = export
        .join()
        .expect("export")
        .expect("u3m's handle")
        .expect("exported");
    assert_ne!(real, h);
    assert!(copies(&f.seen()) >= issued + 4, "copied again");
    assert_eq!(f.seen().locked_waits, before, "export's waits");
    assert_eq!(sync_call(r, f, 0, v, 2 * CHUNK, None).unwrap(), want);
    // through the real handle itself, mapped elsewhere (the fake's view)
    let v2 = f.reserve(2 * CHUNK).unwrap();
    f.map(v2, 2 * CHUNK, real).unwrap();
    assert_eq!(f.app_read(v2, 2 * CHUNK).unwrap(), want, "the real handle");
    f.unmap(v2).unwrap();
    f.release(v2).unwrap();
    let s = f.seen();
    assert_no_misuse_or_fault(&s);
    assert_eq!(r.unmap(v), Some(Ok(())));
    assert_eq!(r.free_physical(h), Some(Ok(())));
    f.release(v).unwrap();
}

/// Issue 10 part 2 (branch nolock3): a call that fails in `prepare` after
/// issuing copy-ins (here the second of two chunks' copy-in is refused)
/// waited for them with the device's lock held (a stream sync: nothing
/// else ordered them). Now they are a use of the chunks they fill and are
/// waited for without the lock: while that wait is held inside the
/// runtime, another thread reads the arriving chunk — it orders itself
/// after the same copy and gets its bytes — and the failed call's chunks
/// read back whole afterwards. On 2d7a3f4 the held wait is the locked
/// stream sync.
#[test]
fn a_failed_calls_copy_ins_are_waited_for_without_the_lock() {
    let (f, r) = lazy_rig(2, &[]);
    let (free, total) = f.mem_info().unwrap();
    let x = r.malloc(0, 2 * CHUNK, free, total).unwrap().unwrap();
    let px = pattern(1, 2 * CHUNK);
    sync_call(r, f, 0, x, 2 * CHUNK, Some(&px)).unwrap();
    assert!(r.make_room(0, 2 * CHUNK).is_some(), "x evicted");
    f.drain();
    assert_eq!(r.usage(0).0, 0);
    let before = f.seen().locked_waits;
    // the first chunk's copy-in is queued, the second's refused
    f.fail_h2d_after(1, 1);
    f.hold_waits(1);
    let failing = std::thread::spawn(move || sync_call(r, f, 0, x, 2 * CHUNK, None));
    assert_eq!(
        f.waits_held(10_000),
        1,
        "the failed call waits for its copy-in"
    );
    let st = r.shard_of(0).st.try_lock();
    assert!(st.is_ok(), "the device's lock is free during the wait");
    drop(st);
    let reader = std::thread::spawn(move || sync_call(r, f, 0, x, CHUNK, None).unwrap());
    assert_eq!(
        reader.join().expect("reader"),
        px[..CHUNK as usize],
        "chunk 0"
    );
    f.release_waits();
    assert!(failing.join().expect("the failing call").is_err());
    assert_eq!(sync_call(r, f, 0, x, 2 * CHUNK, None).unwrap(), px, "x");
    let s = f.seen();
    assert_eq!(s.locked_waits, before, "host waits with the lock held");
    assert_no_misuse_or_fault(&s);
    assert_eq!(r.free(x), Some(Ok(())));
    assert_eq!(r.usage(0).0, 0);
}

/// HBM of two chunks, both filled by two one-chunk allocations written
/// with `pattern(1)` and `pattern(2)`; the fake not eager (a copy-out lands
/// only when someone waits for it).
fn two_written_chunks() -> (&'static Fake, Residency, [u64; 2]) {
    let f = Fake::leak(1, 2 * CHUNK);
    let r = Residency::new(f, &config(&[])).expect("residency");
    let (free, total) = f.mem_info().unwrap();
    let x = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    let y = r.malloc(0, CHUNK, free, total).unwrap().unwrap();
    for (k, va) in [x, y].into_iter().enumerate() {
        sync_call(&r, f, 0, va, CHUNK, Some(&pattern(k as u64 + 1, CHUNK))).expect("write");
    }
    f.drain();
    (f, r, [x, y])
}

/// Issue 10 part 2: `make_room` (an allocation u3m does not manage was
/// refused for lack of HBM) waits for the copy-outs that free the room
/// without the device's lock — on da4269a `settle_outgoing` synchronised
/// u3m's device-to-host stream with it held — and the room is free when it
/// returns (the caller retries its allocation at once). The data evicted
/// comes back intact.
#[test]
fn make_room_waits_for_its_copy_outs_without_the_lock() {
    let (f, r, [x, y]) = two_written_chunks();
    let (hbm_free, _) = f.mem_info().unwrap();
    let waits_before = f.seen().locked_waits;
    assert!(r.make_room(0, 2 * CHUNK).is_some(), "x and y evicted");
    assert_eq!(r.usage(0).0, 0, "the room is free when make_room returns");
    assert_eq!(
        f.mem_info().unwrap().0,
        hbm_free + 2 * CHUNK,
        "the runtime sees the HBM given back"
    );
    let s = f.seen();
    assert_eq!(
        s.locked_waits, waits_before,
        "make_room waited with the residency lock held"
    );
    assert_eq!(r.counters().to_dram, 2, "both were dirty: copied out");
    for (k, va) in [x, y].into_iter().enumerate() {
        assert_eq!(
            sync_call(&r, f, 0, va, CHUNK, None).expect("read"),
            pattern(k as u64 + 1, CHUNK)
        );
        assert_eq!(r.free(va), Some(Ok(())));
    }
    assert_no_misuse_or_fault(&f.seen());
}

/// The room `make_room` freed is the caller's until its retry: a fault-in
/// of another thread meanwhile evicts rather than take it (the 207001 an
/// unmanaged allocation of `tests/hostmap_stream.rs`'s mt_stress got once
/// in six CI runs, its room taken between `make_room` and the retry).
/// Fails if the fault-in takes the held chunk, if the hold outlives the
/// `Room`, or if a byte is lost.
#[test]
fn the_room_made_is_held_for_the_caller_until_dropped() {
    let (f, r, [x, y]) = two_written_chunks();
    let base = f.mem_info().unwrap().0;
    let room = r.make_room(0, CHUNK).expect("one evicted");
    assert_eq!(f.mem_info().unwrap().0, base + CHUNK, "the room is free");
    // the other thread's call: both chunks, the evicted one faulted back
    // in by evicting the other
    for (k, va) in [x, y].into_iter().enumerate() {
        assert_eq!(
            sync_call(&r, f, 0, va, CHUNK, None).expect("read"),
            pattern(k as u64 + 1, CHUNK)
        );
        assert_eq!(
            f.mem_info().unwrap().0,
            base + CHUNK,
            "a fault-in took the room held for the caller"
        );
    }
    assert_eq!(r.usage(0).0, CHUNK, "one resident beside the room");
    drop(room);
    // given back: the next fault-in takes the free chunk, evicting nothing
    for (k, va) in [x, y].into_iter().enumerate() {
        assert_eq!(
            sync_call(&r, f, 0, va, CHUNK, None).expect("read"),
            pattern(k as u64 + 1, CHUNK)
        );
    }
    assert_eq!(
        r.usage(0).0,
        2 * CHUNK,
        "both resident once the room is given back"
    );
    for va in [x, y] {
        assert_eq!(r.free(va), Some(Ok(())));
    }
    assert_no_misuse_or_fault(&f.seen());
}

/// Issue 10 part 2: a VMM handle's dirty chunks are copied out
/// asynchronously, read at VAs of u3m's own (on da4269a: one at a time
/// with u3m's stream synchronised and the lock held, 11 of the 75
/// residency and engine tests' locked waits). Copies run only when waited
/// for here, so the program acts while they are in flight: it unmaps the
/// handle and maps it elsewhere (a copy reading the program's VA would
/// fault), a call on the new VA waits for the copy and faults the chunk
/// back, and a handle freed with its copy-outs in flight gives everything
/// back (freeing memory still mapped at a copy's VA is a misuse the fake
/// reports). No host wait with the lock held, every byte where it belongs.
#[test]
fn a_vmm_handles_copy_outs_run_asynchronously_and_outlive_the_programs_unmap() {
    // LRU's order, predicting nothing: the background round takes them all
    let (mut policy, _) = Script::new();
    policy.lru = true;
    let a = App::with_policy(4, Box::new(policy));
    let h = a.r.malloc_physical(0, 2 * CHUNK, false).unwrap().unwrap();
    let (v1, v2) = (
        a.f.reserve(2 * CHUNK).unwrap(),
        a.f.reserve(2 * CHUNK).unwrap(),
    );
    assert_eq!(a.r.map(v1, 2 * CHUNK, 0, h), Some(Ok(())));
    let p = pattern(8, 2 * CHUNK);
    a.write(v1, &p);
    a.f.drain();
    let waits_before = a.f.seen().locked_waits;
    // the background round evicts both (dirty): two copy-outs queued
    assert_eq!(a.r.enforce_watermarks(0, 0.0, 0.0), 2);
    assert_eq!(a.r.counters().to_dram, 0, "in flight, not landed yet");
    assert_eq!(a.r.unmap(v1), Some(Ok(())));
    assert_eq!(a.r.map(v2, 2 * CHUNK, 0, h), Some(Ok(())));
    assert_eq!(a.read(v2, 2 * CHUNK), p, "read back through the new VA");
    let c = a.r.counters();
    assert_eq!((c.to_dram, c.rescued), (2, 0), "{c:?}");
    assert!(c.faults_in >= 4, "faulted back after the copies: {c:?}");
    // again, and the handle freed while its copy-outs are in flight
    let q = pattern(9, 2 * CHUNK);
    a.write(v2, &q);
    assert_eq!(a.r.enforce_watermarks(0, 0.0, 0.0), 2);
    assert_eq!(a.r.unmap(v2), Some(Ok(())));
    assert_eq!(a.r.free_physical(h), Some(Ok(())));
    a.f.release(v1).unwrap();
    a.f.release(v2).unwrap();
    a.r.finalize();
    a.f.drain();
    assert_eq!(a.f.held(), (0, 0), "handles / pinned host bytes left");
    assert_eq!(
        a.f.seen().locked_waits,
        waits_before,
        "host waits with the residency lock held"
    );
    a.assert_clean();
}

/// The event pool hands out its oldest complete event first
/// (`pooled_event` scans from the front and stops after 8): taking one must
/// not move the newest to the front, where the next fence's scan would meet
/// a recent event, mostly not complete yet, and query it in vain.
#[test]
fn the_event_pool_hands_out_its_oldest_complete_event_first() {
    let a = App::new(4, &[]);
    let s = a.r.shard_of(0);
    let evs: Vec<u64> = (0..4).map(|_| a.f.create_event().unwrap()).collect();
    let mut st = s.st.lock().unwrap();
    st.free_events = evs.iter().copied().collect();
    let got: Vec<u64> = (0..4).map(|_| s.pooled_event(&mut st).unwrap()).collect();
    assert_eq!(got, evs, "oldest first");
    assert!(st.free_events.is_empty());
}

/// LRU that records every call's keys and touches as the policy sees them.
struct RecordingLru {
    lru: crate::policy::Lru,
    seen: &'static std::sync::Mutex<Vec<(Vec<u64>, Vec<Touch>)>>,
}

impl crate::policy::Placement for RecordingLru {
    fn name(&self) -> &'static str {
        "recording-lru"
    }
    fn on_access(&self, now: u64, class: u8, keys: &[u64], writes: &[Touch]) {
        self.seen
            .lock()
            .unwrap()
            .push((keys.to_vec(), writes.to_vec()));
        self.lru.on_access(now, class, keys, writes)
    }
    fn order(&self, now: u64, cands: &mut [crate::policy::Cand]) {
        self.lru.order(now, cands)
    }
    fn predicts(&self, now: u64, key: u64, w: u64) -> bool {
        self.lru.predicts(now, key, w)
    }
}

/// Calls on resident chunks of one allocation — most in one chunk of the
/// VA entry the previous call kept (`prepare_one`'s calls), some spanning
/// chunks or allocations (the general path) — hand the policy, for each
/// chunk, exactly: written if any range writes it, overwritten whole only
/// if every range covering it writes all of it whole (`Range::whole`, or
/// every write of a copy: `overwrite`); empty ranges touch nothing.
#[test]
fn calls_on_resident_chunks_touch_each_chunk_as_its_ranges_say() {
    static SEEN: std::sync::Mutex<Vec<(Vec<u64>, Vec<Touch>)>> = std::sync::Mutex::new(Vec::new());
    let a = App::with_policy(
        16,
        Box::new(RecordingLru {
            lru: crate::policy::Lru::new(),
            seen: &SEEN,
        }),
    );
    let x = a.malloc(4 * CHUNK);
    let y = a.malloc(CHUNK);
    let s = a.f.app_stream();
    let rg = |addr, len, write, whole| Range {
        addr,
        len,
        write,
        whole,
    };
    let c1 = x + CHUNK;
    let cases: Vec<Vec<Range>> = vec![
        vec![rg(c1, CHUNK, true, true)],
        vec![rg(c1, CHUNK, true, false)],
        vec![rg(c1, CHUNK, false, true)],
        vec![rg(c1 + 64, 64, false, false), rg(c1, CHUNK, true, true)],
        vec![rg(c1, CHUNK, true, true), rg(c1 + 64, 64, false, false)],
        vec![rg(c1, CHUNK, true, true), rg(c1, CHUNK, true, true)],
        vec![rg(c1, CHUNK, true, true), rg(c1 + 8, CHUNK - 8, true, true)],
        vec![rg(c1, CHUNK - 1, true, true)],
        vec![rg(c1 + 1, CHUNK - 1, true, true)],
        vec![rg(c1, 0, true, true), rg(c1 + 4096, 64, true, false)],
        vec![
            rg(c1 + 64, 64, false, false),
            rg(c1 + 128, 64, false, false),
            rg(c1 + 4096, 0, false, false),
            rg(c1 + 192, 64, true, false),
        ],
        vec![rg(x + 3 * CHUNK, CHUNK, true, true)],
        vec![rg(x + 3 * CHUNK + 100, 64, false, false)],
        vec![rg(c1 + CHUNK - 64, 128, true, false)],
        vec![rg(c1, 64, false, false), rg(c1 + CHUNK, 64, true, false)],
        vec![rg(c1, 2 * CHUNK, true, true)],
        vec![rg(c1 + 64, 64, true, false), rg(y, CHUNK, true, true)],
        vec![rg(y, CHUNK, true, true)],
        vec![rg(c1, CHUNK, true, true), rg(y, 64, false, false)],
        vec![rg(x, 64, false, false), rg(x, CHUNK, true, false)],
    ];
    // the same calls, in the same order, twice (each allocation's entry
    // kept by the call before from the second call on)
    for overwrite in [false, true, false] {
        for (k, rs) in cases.iter().enumerate() {
            // what the policy must see: each chunk any range covers, in
            // address order
            let mut want: Vec<(u64, Touch)> = Vec::new();
            for (base, chunks) in [(x, 4), (y, 1)] {
                for c in 0..chunks {
                    let cs = base + c * CHUNK;
                    let cover: Vec<&Range> = rs
                        .iter()
                        .filter(|r| r.len > 0 && r.addr < cs + CHUNK && r.addr + r.len > cs)
                        .collect();
                    if cover.is_empty() {
                        continue;
                    }
                    let write = cover.iter().any(|r| r.write);
                    let whole = cover.iter().all(|r| {
                        (overwrite || r.whole)
                            && r.write
                            && r.addr <= cs
                            && r.addr + r.len >= cs + CHUNK
                    });
                    want.push((cs, Touch::new(write, whole)));
                }
            }
            SEEN.lock().unwrap().clear();
            let tok =
                a.r.prepare(0, OpClass::Layout as u8, rs, overwrite, Order::Stream(s))
                    .expect("prepare");
            a.r.finish(tok, Some(s), true);
            let seen = std::mem::take(&mut *SEEN.lock().unwrap());
            assert_eq!(seen.len(), 1, "case {k} overwrite {overwrite}");
            let got: Vec<(u64, Touch)> = seen[0]
                .0
                .iter()
                .copied()
                .zip(seen[0].1.iter().copied())
                .collect();
            assert_eq!(got, want, "case {k} overwrite {overwrite}: {rs:?}");
        }
    }
    a.assert_clean();
}

/// A one-chunk call's token carries the chunk `prepare` found (protocol.rs
/// `Token::one_at`), which `finish` uses only while the state's kept VA
/// entry is still of that chunk's backing. An allocation freed while a call
/// on it is in flight (a program's race) and a new one of the same size
/// made — whose chunk vector may well take the freed one's memory — the
/// call's `finish` touches neither: the new allocation's chunk has no use,
/// no pin and is clean. Fails when `finish` uses the carried chunk without
/// the kept-entry check (seen failing: glibc gives the new chunk vector the
/// freed one's block).
#[test]
fn a_call_on_memory_freed_meanwhile_finishes_without_touching_the_next_allocation() {
    let a = App::new(16, &[]);
    let s = a.f.app_stream();
    let x = a.malloc(CHUNK);
    a.write(x, &pattern(1, CHUNK));
    let rs = small_write(x);
    let call = || {
        a.r.prepare(0, OpClass::Other as u8, &rs, false, Order::Stream(s))
            .expect("prepare")
    };
    // x's entry kept: the call is prepared on the one-chunk path
    let tok = call();
    a.r.finish(tok, Some(s), true);
    let tok = call();
    assert!(a.r.shard_of(0).st.lock().unwrap().vas.kept().is_some());
    a.free(x);
    let y = a.malloc(CHUNK);
    a.r.finish(tok, Some(s), true);
    let st = a.r.shard_of(0).st.lock().unwrap();
    let (id, _) = *st.vas.get(&y).expect("y mapped");
    let c = st.chunk(id, 0);
    assert!(
        c.uses.is_empty() && c.pins == 0 && !c.dirty,
        "the next allocation's chunk was touched: uses {:?}, pins {}, dirty {}",
        c.uses,
        c.pins,
        c.dirty
    );
    drop(st);
    assert_no_misuse_or_fault(&a.f.seen());
}

/// A 64-byte partial write at `addr`: one chunk, the one-chunk path's call.
fn small_write(addr: u64) -> [Range; 1] {
    [Range {
        addr,
        len: 64,
        write: true,
        whole: false,
    }]
}

/// `prepare`'s one-chunk path reads the kept VA entry's backing as it was
/// kept (state.rs `KeptAt`: its chunk vector's address, device, first
/// mapping), not looked up. Handles made meanwhile grow `backings` (its
/// table rehashed: every `Backing` moved) without forgetting the kept
/// entry; the calls after them must still find the same chunk (the
/// `cfg(test)` assertions in `prepare_resident` compare it with a look-up)
/// and note the use on it.
#[test]
fn the_kept_entrys_chunk_survives_a_rehash_of_the_backings() {
    let a = App::new(64, &[("U3M_OVERSUB", "4")]);
    let s = a.f.app_stream();
    let x = a.malloc(CHUNK);
    let rs = small_write(x);
    let call = || {
        let tok =
            a.r.prepare(0, OpClass::Other as u8, &rs, false, Order::Stream(s))
                .expect("prepare");
        a.r.finish(tok, Some(s), true);
    };
    call();
    call();
    assert!(a.r.shard_of(0).st.lock().unwrap().vas.kept_at().is_some());
    let hs: Vec<u64> = (0..40)
        .map(|_| a.r.malloc_physical(0, CHUNK, false).unwrap().unwrap())
        .collect();
    assert!(a.r.shard_of(0).st.lock().unwrap().vas.kept_at().is_some());
    call();
    call();
    let st = a.r.shard_of(0).st.lock().unwrap();
    let (id, _) = *st.vas.get(&x).expect("x mapped");
    let c = st.chunk(id, 0);
    assert!(c.dirty && c.pins == 0 && c.uses.iter().any(|u| u.0 == s));
    drop(st);
    drop(hs);
    assert_no_misuse_or_fault(&a.f.seen());
}

/// The scan's memo (`state::Resolver`) resolves every key as
/// `State::resolve` does: keys in runs of one allocation (memo hits), keys
/// jumping between allocations, into freed ones and gaps, and the chunk
/// index from the allocation's first VA; and gives the chunk's backing.
#[test]
fn the_scans_memo_resolves_as_the_state() {
    let a = App::new(64, &[]);
    let vas: Vec<u64> = (0..12)
        .map(|k| a.malloc((1 + k % 5) * CHUNK + k * 4096))
        .collect();
    for &va in vas.iter().step_by(3) {
        a.free(va);
    }
    let st = a.r.shard_of(0).st.lock().unwrap();
    let (lo, hi) = (
        vas.iter().min().unwrap() - 4 * CHUNK,
        vas.iter().max().unwrap() + 8 * CHUNK,
    );
    let mut rnd = crate::test_rng(0x9e37_79b9_7f4a_7c15);
    let mut memo = super::state::Resolver::default();
    let mut found = 0;
    for n in 0..20_000 {
        // a run through one allocation, else anywhere in the range
        let key = if n % 3 == 0 {
            lo + rnd(hi - lo)
        } else {
            let va = vas[rnd(vas.len() as u64) as usize];
            va + rnd(6) * CHUNK + rnd(CHUNK)
        };
        let want = st.resolve(key);
        let got = memo.resolve_in(&st, key);
        assert_eq!(got.map(|g| (g.0, g.1)), want, "key {key:#x}");
        if let Some((id, _, b)) = got {
            assert!(std::ptr::eq(b, &st.backings[&id]));
        }
        found += want.is_some() as u32;
    }
    assert!(found > 5_000, "{found} of 20000 keys resolved");
}

/// `evict::apply_edits` edits the last build's candidates in place as a
/// copy with the edits made along the way would: random removals and
/// insertions (several before one index, at either end, none) over lists
/// of 0 to 40, shifting runs down, up, or both in one edit.
#[test]
fn candidates_are_edited_in_place_as_a_copy_would() {
    use crate::policy::Cand;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| -> u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let cand = |s: u32| Cand {
        key: s as u64 * 3 + 1,
        last: s as u64,
        dirty: s % 2 == 1,
    };
    let (mut moved_up, mut moved_down) = (0, 0);
    for round in 0..4000 {
        let n = next(41) as usize;
        // places 10, 20, ...: new ones go between
        let ps0: Vec<u32> = (1..=n as u32).map(|i| i * 10).collect();
        let p0: Vec<Cand> = ps0.iter().map(|&s| cand(s)).collect();
        let mut edits = Vec::new();
        let mut want: (Vec<u32>, Vec<Cand>) = (Vec::new(), Vec::new());
        for j in 0..=n {
            // puts before index j, at places below its own
            for k in 0..[0, 0, 0, 0, 0, 1, 3][next(7) as usize] {
                let s = j as u32 * 10 + 1 + k;
                edits.push((j, Some((s, cand(s)))));
                want.0.push(s);
                want.1.push(cand(s));
            }
            if j < n {
                if next([2, 8, 1000][round % 3]) == 0 {
                    edits.push((j, None));
                } else {
                    want.0.push(ps0[j]);
                    want.1.push(p0[j]);
                }
            }
        }
        let (mut ps, mut p) = (ps0.clone(), p0.clone());
        super::evict::apply_edits(&mut ps, &mut p, &edits);
        assert_eq!((&ps, &p), (&want.0, &want.1), "{ps0:?} edited by {edits:?}");
        let net = want.0.len() as isize - n as isize;
        moved_up += (net > 0) as u32;
        moved_down += (net < 0) as u32;
    }
    assert!(
        moved_up > 500 && moved_down > 500,
        "{moved_up} up, {moved_down} down"
    );
}

/// A victim order's build reads only the chunks marked since the last one
/// (`evict::track_victims`), and gives what a walk of every chunk gives:
/// in test builds every such build is checked against the walk
/// (`evict::check_tracked`), here under evictions, copy-outs in flight,
/// frees and allocations on a small device, with two streams' calls.
#[test]
fn victim_orders_are_built_from_the_chunks_marked_as_a_walk_would() {
    let a = App::new(6, &[]);
    let streams = [a.f.app_stream(), a.f.app_stream()];
    let mut rng = pattern(7, 4096).into_iter().cycle();
    let mut next = move |n: u64| -> u64 {
        let v = (rng.next().unwrap() as u64) << 8 | rng.next().unwrap() as u64;
        v % n
    };
    let mut live: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    for step in 0..400u64 {
        match next(16) {
            0 | 1 if live.len() < 8 => {
                let bytes = (2 + next(5)) * MIB;
                let va = a.malloc(bytes);
                let p = pattern(step, bytes);
                a.write(va, &p);
                live.push((va, bytes, p));
            }
            2 if live.len() > 4 => {
                let (va, _, _) = live.swap_remove(next(live.len() as u64) as usize);
                a.f.drain();
                a.free(va);
            }
            3 => a.f.drain(),
            _ if !live.is_empty() => {
                // dst = src + 1 over the shorter of two allocations, on
                // either stream (after the other's work: one order)
                let k = next(live.len() as u64) as usize;
                let j = next(live.len() as u64) as usize;
                let len = live[k].1.min(live[j].1) / [1, 2][next(2) as usize];
                let (src, dst) = (live[k].0, live[j].0);
                a.f.drain();
                let s = streams[next(2) as usize];
                a.op(s, &[(src, len)], &[(dst, len)], add(src, dst, len, 1));
                let v: Vec<u8> = live[k].2[..len as usize]
                    .iter()
                    .map(|b| b.wrapping_add(1))
                    .collect();
                live[j].2[..len as usize].copy_from_slice(&v);
            }
            _ => {}
        }
    }
    a.f.drain();
    for (va, bytes, p) in &live {
        assert_eq!(&a.read(*va, *bytes), p);
    }
    let st = a.r.shard_of(0).st.lock().unwrap();
    let o = &st.dev(0).order;
    let c = a.r.counters();
    assert!(c.evictions > 100, "{c:?}");
    // most builds read the marks; a free or an allocation makes one walk
    assert!(
        o.tracked > 2 * o.walks && o.walks > 0,
        "{} builds from marks, {} walks",
        o.tracked,
        o.walks
    );
}

/// A victim order built from marks that missed every candidate (its last
/// build's list lost) never refuses a fault-in: "nothing can move" is said
/// only after a walk of every chunk (`evict::evict_one`).
#[test]
fn a_victim_order_that_lost_its_candidates_still_finds_them() {
    let a = App::new(4, &[]);
    let s = a.f.app_stream();
    let vas: Vec<u64> = (0..6).map(|_| a.malloc(CHUNK)).collect();
    for (k, &va) in vas.iter().enumerate() {
        a.write(va, &pattern(k as u64, CHUNK));
    }
    for k in 0..6u64 {
        let (src, dst) = (vas[k as usize], vas[(k as usize + 1) % 6]);
        a.op(s, &[(src, 64)], &[(dst, 64)], add(src, dst, 64, 1));
    }
    a.f.drain();
    {
        let mut st = a.r.shard_of(0).st.lock().unwrap();
        let o = &mut st.dev_mut(0).order;
        assert!(o.walks > 0 && !o.marks_over, "built from a walk first");
        (o.checked, o.marks_over) = (false, false);
        o.prev.clear();
        o.prev_seq.clear();
        o.marks.clear();
        // the order is used up and stale: the next eviction builds it
        o.next = o.cands.len();
        o.tail = Default::default();
    }
    // two chunks out of HBM, in one call: its first fault-in builds the
    // order from no marks and no previous candidates
    let (walks, out) = {
        let st = a.r.shard_of(0).st.lock().unwrap();
        let out: Vec<u64> = vas
            .iter()
            .copied()
            .filter(|&va| {
                let (id, i) = st.resolve(va).unwrap();
                st.chunk(id, i).phys == 0
            })
            .collect();
        (st.dev(0).order.walks, out)
    };
    assert!(out.len() >= 2, "{} chunks out", out.len());
    a.op(
        s,
        &[(out[0], 64)],
        &[(out[1], 64)],
        add(out[0], out[1], 64, 1),
    );
    a.f.drain();
    let st = a.r.shard_of(0).st.lock().unwrap();
    assert!(st.dev(0).order.walks > walks, "walked again");
    drop(st);
    a.assert_clean();
}

/// A chunk a call writes whole is mapped `unfilled`: no copy-in, its memory
/// holds nothing of it until the call runs. When that call's fault-in must
/// wait unlocked for other work (Busy: here its room is held by a call in
/// flight), its reservations go and the chunk stays mapped, unpinned. On
/// the old code another thread then read the memory's bytes (fresh zeros
/// here) as the chunk's, and an eviction copied them out over its host
/// copy, which the call, failing, left as the chunk's contents. Now the
/// reader gives the chunk back to its host copy first, and the eviction
/// drops it without a copy-out.
#[test]
fn an_unfilled_chunk_is_not_data_while_its_call_waits_unlocked() {
    for meanwhile in ["read", "evict"] {
        let (f, r) = lazy_rig(2, &[]);
        let call = |va: u64, data: Option<&[u8]>| -> Vec<u8> {
            sync_call(r, f, 0, va, CHUNK, data).expect("call")
        };
        let (free, total) = f.mem_info().unwrap();
        let m = || r.malloc(0, CHUNK, free, total).unwrap().unwrap();
        let (x, y, z, w) = (m(), m(), m(), m());
        call(x, Some(&pattern(1, CHUNK)));
        call(w, Some(&pattern(5, CHUNK)));
        assert!(r.make_room(0, 2 * CHUNK).is_some(), "x, w out: host copies");
        f.drain();
        call(y, Some(&pattern(2, CHUNK)));
        // a call in flight on y (prepared, not finished): y is pinned
        let s = f.app_stream();
        let rd = |va: u64| Range {
            addr: va,
            len: CHUNK,
            write: false,
            whole: false,
        };
        let ytok = r
            .prepare(
                0,
                OpClass::Elementwise as u8,
                &[rd(y)],
                false,
                Order::Stream(s),
            )
            .expect("prepare");
        // x written whole (the free chunk, unfilled) and z's first touch:
        // no room for z while y is pinned — the writer retries, unlocked
        // between tries. With an eviction meanwhile its call fails
        // (writes nothing): x must keep its bytes.
        let ok = meanwhile == "read";
        let writer = std::thread::spawn(move || {
            let wr = |va: u64| Range {
                addr: va,
                len: CHUNK,
                write: true,
                whole: true,
            };
            let tok = r
                .prepare(
                    0,
                    OpClass::Elementwise as u8,
                    &[wr(x), wr(z)],
                    false,
                    Order::Host,
                )
                .expect("prepare");
            if ok {
                f.app_write(x, &pattern(3, CHUNK)).unwrap();
                f.app_write(z, &pattern(4, CHUNK)).unwrap();
            }
            r.finish(tok, None, ok);
        });
        let unfilled = |va: u64| {
            let st = r.shard_of(0).st.lock().unwrap();
            let (id, i) = st.resolve(va).unwrap();
            let c = st.chunk(id, i);
            c.unfilled && c.in_hbm() && c.pins == 0
        };
        let t = std::time::Instant::now();
        while !unfilled(x) {
            assert!(
                t.elapsed().as_secs() < 10,
                "{meanwhile}: x never mapped unfilled"
            );
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let other = std::thread::spawn(move || {
            if ok {
                assert_eq!(call(x, None), pattern(1, CHUNK), "x read meanwhile");
            } else {
                // w's room: x's (y is pinned)
                assert_eq!(call(w, None), pattern(5, CHUNK));
            }
        });
        other.join().expect("the other thread");
        f.app_launch(
            s,
            "read y",
            vec![(y, CHUNK)],
            Box::new(|_: &mut Mem<'_>| {}),
        )
        .unwrap();
        r.finish(ytok, Some(s), true);
        writer.join().expect("writer");
        let x_now = if ok { 3 } else { 1 };
        for (va, seed) in [(x, x_now), (y, 2), (w, 5), (x, x_now)] {
            assert_eq!(call(va, None), pattern(seed, CHUNK), "{meanwhile}: {va:#x}");
        }
        if ok {
            assert_eq!(call(z, None), pattern(4, CHUNK));
        }
        assert_no_misuse_or_fault(&f.seen());
        for va in [x, y, z, w] {
            assert_eq!(r.free(va), Some(Ok(())));
        }
        f.drain();
        assert_eq!(r.usage(0), (0, 0, 0));
    }
}

/// A call whose fault-in fails after it mapped a chunk it writes whole
/// (`unfilled`) does not run: that chunk goes back to its host copy with
/// the failure. On the old code it stayed mapped, holding nothing of it,
/// and the next read got the memory's bytes.
#[test]
fn a_failed_fault_in_gives_back_the_chunk_it_mapped_unfilled() {
    let a = App::new(2, &[]);
    let [x, w] = [0; 2].map(|_| a.malloc(CHUNK));
    a.write(x, &pattern(1, CHUNK));
    a.write(w, &pattern(2, CHUNK));
    assert!(a.r.make_room(0, 2 * CHUNK).is_some(), "x and w out");
    a.f.drain();
    // x written whole (mapped unfilled, first), w read: its copy-in fails
    a.f.fail_h2d(1);
    let rs = [
        Range {
            addr: x,
            len: CHUNK,
            write: true,
            whole: true,
        },
        Range {
            addr: w,
            len: CHUNK,
            write: false,
            whole: false,
        },
    ];
    let s = a.f.app_stream();
    let r =
        a.r.prepare(0, OpClass::Elementwise as u8, &rs, false, Order::Stream(s));
    assert!(r.is_err(), "the copy-in failed: the call is refused");
    assert!(!resident(&a, x), "x back to its host copy");
    assert_eq!(a.read(x, CHUNK), pattern(1, CHUNK));
    assert_eq!(a.read(w, CHUNK), pattern(2, CHUNK));
    for va in [x, w] {
        a.free(va);
    }
    a.f.drain();
    a.assert_clean();
}

/// A kernel of the auto-plan test: dst = a + b (+ c), byte by byte.
fn sum(a: u64, b: u64, dst: u64, c: u8) -> Kernel {
    Box::new(move |m: &mut Mem<'_>| {
        let (x, y) = (m.read(a, CHUNK), m.read(b, CHUNK));
        let v: Vec<u8> = x
            .iter()
            .zip(&y)
            .map(|(p, q)| p.wrapping_add(*q).wrapping_add(c))
            .collect();
        m.write(dst, &v);
    })
}

/// U3M_PLAN=auto (autoplan.rs): u3m finds the program's step (six calls on
/// five one-chunk allocations, on a 3-chunk device), records one, plans a
/// schedule on its own thread and follows it from then on, every byte as
/// the host's reference computes it; a step that differs stops the
/// schedule, named, and the run goes on right. With and without the
/// hand-off.
#[test]
fn auto_plan_finds_the_step_plans_it_and_follows_its_schedule() {
    for handoff in ["off", "on"] {
        let a = App::new(
            3,
            &[
                ("U3M_PLAN", "auto"),
                ("U3M_HANDOFF", handoff),
                ("U3M_PLAN_MIN_GAP_US", "0"),
            ],
        );
        a.r.set_look_ahead(false);
        let v: Vec<u64> = (0..5).map(|_| a.malloc(CHUNK)).collect();
        let mut want: Vec<Vec<u8>> = (0..5).map(|k| pattern(60 + k, CHUNK)).collect();
        for k in 0..5 {
            a.write(v[k], &want[k]);
        }
        let s = a.f.app_stream();
        // one step: (a, b, dst, c) each dst = a + b + c
        let step = [
            (0, 1, 2, 0),
            (2, 2, 3, 1),
            (3, 0, 4, 0),
            (4, 4, 0, 1),
            (1, 2, 1, 0),
        ];
        let run = |a: &App, want: &mut Vec<Vec<u8>>, skip: Option<usize>| {
            for (n, &(x, y, d, c)) in step.iter().enumerate() {
                if Some(n) == skip {
                    continue;
                }
                let ins: Vec<(u64, u64)> = [x, y].iter().map(|&k| (v[k], CHUNK)).collect();
                a.op(s, &ins, &[(v[d], CHUNK)], sum(v[x], v[y], v[d], c));
                let w: Vec<u8> = want[x]
                    .iter()
                    .zip(&want[y])
                    .map(|(p, q)| p.wrapping_add(*q).wrapping_add(c))
                    .collect();
                want[d] = w;
            }
            // the sixth call: a read of v[3]
            a.op(s, &[(v[3], CHUNK)], &[], Box::new(|_: &mut Mem<'_>| {}));
        };
        let mut steps = 0;
        let t = std::time::Instant::now();
        while a
            .r
            .auto_plan()
            .is_some_and(|p| p.entries == 0 && p.failed.is_none())
        {
            run(&a, &mut want, None);
            a.f.sync_stream(s).unwrap();
            steps += 1;
            assert!(
                t.elapsed().as_secs() < 20 && steps < 10_000,
                "{handoff}: no plan after {steps} steps: {:?}",
                a.r.auto_plan()
            );
        }
        let p = a.r.auto_plan().unwrap();
        assert_eq!(p.period, 6, "{handoff}: {p:?}");
        assert!(p.failed.is_none() && p.from > 0, "{handoff}: {p:?}");
        let before = a.r.counters().schedule_entries;
        for _ in 0..4 {
            run(&a, &mut want, None);
        }
        a.f.drain();
        let c = a.r.counters();
        assert!(
            c.schedule_entries > before,
            "{handoff}: not followed: {c:?}"
        );
        assert_eq!(
            c.schedule_stops,
            0,
            "{handoff}: {:?}",
            a.r.schedule_stopped()
        );
        for k in 0..5 {
            assert_eq!(a.read(v[k], CHUNK), want[k], "{handoff}: v{k}");
        }
        // a step that differs (its second call left out): the schedule
        // stops, named, and every byte stays right
        run(&a, &mut want, Some(1));
        run(&a, &mut want, None);
        a.f.drain();
        assert_eq!(a.r.counters().schedule_stops, 1, "{handoff}");
        let why = a.r.schedule_stopped().expect("named");
        assert!(why.contains("U3M_PLAN=auto"), "{why}");
        for k in 0..5 {
            assert_eq!(
                a.read(v[k], CHUNK),
                want[k],
                "{handoff}: v{k} after the stop"
            );
        }
        for va in v {
            a.free(va);
        }
        a.f.drain();
        a.assert_clean();
    }
}
