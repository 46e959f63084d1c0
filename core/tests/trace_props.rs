//! Property tests: writer/reader round trip on random valid traces; the reader
//! never panics on random or mutated input; the recorder's repair pass always
//! produces a valid trace, whatever it is fed.

use proptest::prelude::*;
use u3m_core::trace::event::is_word;
use u3m_core::trace::live::LiveSet;
use u3m_core::trace::repair::{Input, Output, Repair};
use u3m_core::trace::{
    read_str, write_string, Body, CopyKind, Event, Range, TraceReader, TraceWriter,
};

const OPS: &[&str] = &[
    "MatMul",
    "aclnnAdd",
    "FlashAttention",
    "x:y",
    "#notacomment",
    "Ünïcödé",
    "a.b/c",
    "HcclAllReduce",
];
const TAGS: &[&str] = &["weight", "kv", "a=b", "größe", "x:1"];

/// One step of a generated trace; interpreted against a model of live allocations.
#[derive(Debug, Clone)]
struct Step {
    what: u8,
    a: u64,
    b: u64,
    c: u64,
    picks: Vec<(u64, u64, u64)>,
    keys: (u8, u32, Option<u64>, Option<u64>, Option<usize>),
}

fn step() -> impl Strategy<Value = Step> {
    (
        0u8..5,
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 0..6),
        (
            0u8..3,
            prop_oneof![Just(0u32), Just(1), any::<u32>()],
            any::<Option<u64>>(),
            prop::option::of(0..=i64::MAX as u64),
            prop::option::of(0..TAGS.len()),
        ),
    )
        .prop_map(|(what, a, b, c, picks, keys)| Step {
            what,
            a,
            b,
            c,
            picks,
            keys,
        })
}

/// A sub-range of a live allocation on `dev` chosen by `(i, x, y)`, if any is live.
fn pick(live: &LiveSet, dev: u32, (i, x, y): (u64, u64, u64)) -> Option<Range> {
    let allocs: Vec<_> = live
        .iter()
        .filter(|(d, _)| *d == dev)
        .map(|(_, a)| *a)
        .collect();
    if allocs.is_empty() {
        return None;
    }
    let a = allocs[(i % allocs.len() as u64) as usize];
    let off = x % (a.bytes + 1);
    let len = y % (a.bytes - off + 1);
    Some(Range::new(a.addr + off, len))
}

fn build(steps: &[Step]) -> Vec<Event> {
    let mut live = LiveSet::new();
    let mut out = Vec::new();
    for s in steps {
        let (dev, stream, t, flops, tag) = s.keys;
        let dev = dev as u32;
        let body = match s.what {
            0 => {
                // 64 KiB slots: allocations in distinct slots never overlap
                let high = if s.a & 8 != 0 {
                    0xffff_0000_0000_0000
                } else {
                    0
                };
                let addr = high | ((s.b % 4096) << 16) | (s.a >> 48 & 0xfff);
                let bytes = s.c % 0x1_0000 - (s.a >> 48 & 0xfff).min(s.c % 0x1_0000);
                if live.insert(dev, addr, bytes).is_err() {
                    continue;
                }
                Body::Alloc { addr, bytes }
            }
            1 => {
                let allocs: Vec<_> = live
                    .iter()
                    .filter(|(d, _)| *d == dev)
                    .map(|(_, a)| a.addr)
                    .collect();
                if allocs.is_empty() {
                    continue;
                }
                let addr = allocs[(s.a % allocs.len() as u64) as usize];
                live.remove(dev, addr);
                Body::Free { addr }
            }
            2 => {
                let ranges: Vec<Range> = s
                    .picks
                    .iter()
                    .filter_map(|p| pick(&live, dev, *p))
                    .collect();
                let n_in = (s.a as usize) % (ranges.len() + 1);
                Body::Op {
                    op_type: OPS[(s.b % OPS.len() as u64) as usize].to_string(),
                    inputs: ranges[..n_in].to_vec(),
                    outputs: ranges[n_in..].to_vec(),
                }
            }
            3 => {
                let kind = CopyKind::ALL[(s.a % 4) as usize];
                let p = s.picks.first().copied().unwrap_or((s.a, s.b, s.c));
                let Some(r) = pick(&live, dev, p) else {
                    out.push(Event::copy(CopyKind::H2H, s.b, s.c, s.a >> 20).on_dev(dev));
                    continue;
                };
                let other = pick(&live, dev, (s.c, s.b, u64::MAX))
                    .map(|o| o.addr)
                    .unwrap_or(s.c);
                // the device side(s) must hold `bytes`; the second device side uses a range at least as long
                let (dst, src, bytes) = match kind {
                    CopyKind::H2H => (s.b, s.c, r.bytes),
                    CopyKind::H2D => (r.addr, s.c, r.bytes),
                    CopyKind::D2H => (s.b, r.addr, r.bytes),
                    CopyKind::D2D => {
                        let _ = other;
                        (r.addr, r.addr, r.bytes)
                    }
                };
                Body::Copy {
                    kind,
                    dst,
                    src,
                    bytes,
                }
            }
            _ => {
                let Some(r) = s.picks.first().and_then(|p| pick(&live, dev, *p)) else {
                    continue;
                };
                Body::Set {
                    addr: r.addr,
                    bytes: r.bytes,
                }
            }
        };
        let mut e = Event::new(body).on_dev(dev).on_stream(stream);
        e.t = t;
        e.flops = flops;
        e.tag = tag.map(|i| TAGS[i].to_string());
        out.push(e);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn write_then_read_gives_the_same_events(steps in prop::collection::vec(step(), 0..80)) {
        let events = build(&steps);
        let text = write_string(&events);
        let back = read_str(&text, "gen").map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&back, &events);
        // canonical: single spaces, no trailing space, writing again is identical
        for line in text.lines() {
            prop_assert!(!line.contains("  ") && !line.ends_with(' ') && !line.contains('\t'), "{:?}", line);
            prop_assert!(!line.contains(" dev=0") && !line.contains(" stream=0 ") && !line.ends_with(" stream=0"), "{:?}", line);
        }
        prop_assert_eq!(write_string(&back), text);
    }

    #[test]
    fn the_reader_never_panics_on_random_bytes(header in any::<bool>(), bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let mut input = if header { b"# u3m-trace 1\n".to_vec() } else { Vec::new() };
        input.extend_from_slice(&bytes);
        let n = TraceReader::new(&input[..], "fuzz").count();
        prop_assert!(n <= input.len() + 1);
    }

    #[test]
    fn the_reader_never_panics_on_random_lines(lines in prop::collection::vec(line(), 0..30)) {
        let text = format!("# u3m-trace 1\n{}\n", lines.join("\n"));
        check_mutant(&text)?;
    }

    #[test]
    fn the_reader_never_panics_on_mutated_traces(which in 0..SAMPLES.len(), muts in prop::collection::vec(mutation(), 1..4)) {
        let mut text = SAMPLES[which].to_string();
        for m in &muts {
            text = m.apply(&text);
        }
        check_mutant(&text)?;
    }

    #[test]
    fn repair_always_writes_a_valid_trace(inputs in prop::collection::vec(input(), 0..120)) {
        let mut repair = Repair::new();
        let mut outs = Vec::new();
        for i in inputs.iter().cloned() {
            repair.push(i, &mut outs);
        }
        let mut w = TraceWriter::new(Vec::new()).unwrap();
        let mut n = 0;
        for o in &outs {
            match o {
                Output::Event(e) => { w.event(e).unwrap(); n += 1; }
                Output::Comment(c) => w.comment(c).unwrap(),
            }
        }
        let text = String::from_utf8(w.into_inner()).unwrap();
        let back = read_str(&text, "repaired").map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(back.len(), n);
        // every event that was already valid in sequence passes through unchanged
        // when nothing needed repair
        if repair.repaired() == 0 {
            let evs: Vec<_> = inputs.iter().filter_map(|i| if let Input::Event(e) = i { Some(e.clone()) } else { None }).collect();
            if evs.len() == inputs.len() {
                prop_assert_eq!(back, evs);
            }
        }
    }
}

/// Accepted input must round-trip through the writer (when its words are words).
fn check_mutant(text: &str) -> Result<(), TestCaseError> {
    let evs: Result<Vec<Event>, _> = TraceReader::new(text.as_bytes(), "m").collect();
    match evs {
        Ok(evs) => {
            let words_ok = evs.iter().all(|e| {
                e.tag.as_deref().is_none_or(|t| is_word(t, true))
                    && match &e.body {
                        Body::Op { op_type, .. } => is_word(op_type, false),
                        _ => true,
                    }
            });
            if words_ok {
                let back = read_str(&write_string(&evs), "again")
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(back, evs);
            }
        }
        Err(e) => {
            let lines = text.split('\n').count() as u64;
            prop_assert!(
                e.line >= 1 && e.line <= lines.max(1),
                "line {} of {}",
                e.line,
                lines
            );
        }
    }
    Ok(())
}

const SAMPLES: &[&str] = &[
    include_str!("../../tests/traces/example.trace"),
    include_str!("../../tests/traces/interior.trace"),
    include_str!("../../tests/traces/large.trace"),
    include_str!("../../tests/traces/memset.trace"),
    include_str!("../../tests/traces/multidev.trace"),
    include_str!("../../tests/traces/multistream.trace"),
];

const TOKENS: &[&str] = &[
    "A",
    "F",
    "O",
    "M",
    "S",
    "0x",
    "0x0",
    "0x1000",
    "0xffffffffffffffff",
    "0",
    "1",
    "18446744073709551615",
    "18446744073709551616",
    "dev=1",
    "dev=",
    "stream=4294967296",
    "t=5",
    "flops=-1",
    "tag=",
    "tag=x",
    "=",
    "a=b",
    ":",
    "0x10:0",
    "0x10:",
    "H2D",
    "D2D",
    "#",
    "# u3m-trace 1",
    "\t",
    " ",
    "\r",
    "\u{0}",
    "é",
    "1000001",
];

fn line() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..9).prop_map(|t| t.join(" "))
}

#[derive(Debug, Clone)]
enum Mutation {
    DeleteByte(usize),
    InsertToken(usize, &'static str),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    DeleteLine(usize),
    ReplaceToken(usize, &'static str),
    /// Benign ones, so that some mutants are valid and exercise the round trip.
    Respace(usize),
    AppendUnknownKey(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::DeleteByte),
        (any::<usize>(), prop::sample::select(TOKENS))
            .prop_map(|(i, t)| Mutation::InsertToken(i, t)),
        any::<usize>().prop_map(Mutation::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        any::<usize>().prop_map(Mutation::DeleteLine),
        (any::<usize>(), prop::sample::select(TOKENS))
            .prop_map(|(i, t)| Mutation::ReplaceToken(i, t)),
        any::<usize>().prop_map(Mutation::Respace),
        any::<usize>().prop_map(Mutation::AppendUnknownKey),
    ]
}

impl Mutation {
    fn apply(&self, text: &str) -> String {
        let mut lines: Vec<String> = text.split('\n').map(str::to_string).collect();
        let n = lines.len();
        match self {
            Mutation::DeleteByte(i) => {
                let mut b = text.as_bytes().to_vec();
                if !b.is_empty() {
                    b.remove(i % b.len());
                }
                return String::from_utf8_lossy(&b).into_owned();
            }
            Mutation::InsertToken(i, t) => {
                let mut s = text.to_string();
                let mut at = i % (s.len() + 1);
                while !s.is_char_boundary(at) {
                    at -= 1;
                }
                s.insert_str(at, t);
                return s;
            }
            Mutation::DuplicateLine(i) => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Mutation::SwapLines(a, b) => lines.swap(a % n, b % n),
            Mutation::DeleteLine(i) => {
                lines.remove(i % n);
            }
            Mutation::ReplaceToken(i, t) => {
                let l = &mut lines[i % n];
                let mut toks: Vec<&str> = l.split(' ').collect();
                let k = i / n.max(1) % toks.len().max(1);
                if k < toks.len() {
                    toks[k] = t;
                }
                *l = toks.join(" ");
            }
            Mutation::Respace(i) => {
                let l = &mut lines[i % n];
                if let Some((k, _)) = l.match_indices(' ').nth(i / n.max(1) % 4) {
                    l.replace_range(k..k + 1, " \t  ");
                }
            }
            Mutation::AppendUnknownKey(i) => lines[i % n].push_str(" note=x:y=z"),
        }
        lines.join("\n")
    }
}

/// Inputs to the repair pass: plausible and bogus mixed (small address space,
/// so they collide often).
fn input() -> impl Strategy<Value = Input> {
    let addr = || (0u64..64).prop_map(|x| 0x1000 + x * 0x800);
    let bytes = || prop_oneof![Just(0u64), Just(0x800), Just(0x1000), 0u64..0x3000];
    let dev = || 0u32..2;
    let range = move || (addr(), bytes()).prop_map(|(a, b)| Range::new(a, b));
    prop_oneof![
        (dev(), addr(), bytes()).prop_map(|(d, a, b)| Input::Event(Event::alloc(a, b).on_dev(d))),
        (dev(), addr(), bytes()).prop_map(|(d, a, b)| Input::Event(Event::alloc(a, b).on_dev(d))),
        (dev(), addr()).prop_map(|(d, a)| Input::Event(Event::free(a).on_dev(d))),
        (
            dev(),
            prop::collection::vec(range(), 0..4),
            prop::collection::vec(range(), 0..3)
        )
            .prop_map(|(d, i, o)| Input::Event(Event::op("Op", &i, &o).on_dev(d))),
        (dev(), 0usize..4, addr(), addr(), bytes()).prop_map(|(d, k, a, b, n)| Input::Event(
            Event::copy(CopyKind::ALL[k], a, b, n).on_dev(d)
        )),
        (dev(), addr(), bytes()).prop_map(|(d, a, b)| Input::Event(Event::set(a, b).on_dev(d))),
        (
            dev(),
            addr(),
            prop_oneof![Just(0x800u64), Just(0x1000), 0u64..0x2000]
        )
            .prop_map(|(dev, addr, bytes)| Input::Map {
                dev,
                addr,
                bytes,
                t: None
            }),
        (dev(), addr(), prop_oneof![Just(0x800u64), Just(0x1000)]).prop_map(
            |(dev, addr, bytes)| Input::Map {
                dev,
                addr,
                bytes,
                t: None
            }
        ),
        (dev(), addr()).prop_map(|(dev, addr)| Input::Unmap { dev, addr, t: None }),
        (dev(), addr(), addr(), bytes()).prop_map(|(dev, dst, src, bytes)| Input::CopyAuto {
            dev,
            stream: 0,
            dst,
            src,
            bytes,
            t: None
        }),
    ]
}
