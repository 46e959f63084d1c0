//! The reader against the format page: what it accepts, what it rejects (with
//! which line and message), and that it streams.

use std::io::{BufReader, Read};
use std::path::PathBuf;

use u3m_core::trace::reader::{validate, ErrorKind, Role, MAX_LINE};
use u3m_core::trace::{read_file, read_str, Body, CopyKind, Event, Range, TraceError, TraceReader};

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/traces")
}

fn err(text: &str) -> TraceError {
    match read_str(text, "trace.txt") {
        Ok(evs) => panic!("accepted {text:?}: {evs:?}"),
        Err(e) => e,
    }
}

#[test]
fn the_pages_example_reads_as_written() {
    let evs = read_file(traces_dir().join("example.trace")).unwrap();
    let want = vec![
        Event::alloc(0x10000000, 4194304).with_tag("weight"),
        Event::alloc(0x10400000, 1048576).with_tag("act"),
        Event::copy(CopyKind::H2D, 0x10000000, 0x7f0000001000, 4194304),
        Event::op(
            "MatMul",
            &[
                Range::new(0x10000000, 4194304),
                Range::new(0x10400000, 65536),
            ],
            &[Range::new(0x10410000, 65536)],
        )
        .with_flops(134217728),
        Event::free(0x10400000),
    ];
    assert_eq!(evs, want);
}

#[test]
fn every_sample_trace_is_valid() {
    let mut n = 0;
    for entry in std::fs::read_dir(traces_dir()).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "trace") {
            let evs = read_file(&p).unwrap_or_else(|e| panic!("{e}"));
            assert!(!evs.is_empty(), "{}", p.display());
            n += 1;
        }
    }
    assert!(n >= 6, "found {n} sample traces");
}

#[test]
fn syntax_the_page_allows() {
    let text = "\n  \t\n# u3m-trace 1\r\n\
                # comment\n\
                \t  # indented comment\n\
                \n\
                A\t0x1000   4096 dev=2 future=whatever x=\n\
                A 0X10 1\n";
    // "0X10" is not a 0x prefix
    assert_eq!(err(text).line, 8);
    let text =
        "# u3m-trace 1\nA\t0x1000   4096 dev=2 future=whatever x= stream=7 t=123 tag=a=b\r\n\
                O Op 0 0 dev=2\nO Op2 1 0 0x1000:0 dev=2\nS 0x2000 0 dev=2\nF 0x1000 dev=2 dev=2\n";
    let evs = read_str(text, "t").unwrap();
    assert_eq!(
        evs[0],
        Event::alloc(0x1000, 4096)
            .on_dev(2)
            .on_stream(7)
            .at(123)
            .with_tag("a=b"),
        "unknown keys ignored, tag value may hold '='"
    );
    assert_eq!(evs[1], Event::op("Op", &[], &[]).on_dev(2));
    assert_eq!(
        evs[2].body,
        Body::Op {
            op_type: "Op2".into(),
            inputs: vec![Range::new(0x1000, 0)],
            outputs: vec![]
        }
    );
    assert_eq!(
        evs[3],
        Event::set(0x2000, 0).on_dev(2),
        "a zero-byte range at the end of an allocation"
    );
    assert_eq!(evs[4], Event::free(0x1000).on_dev(2));
    // leading zeros, upper-case hex digits, the largest values
    let evs = read_str(
        "# u3m-trace 1\nA 0x00000000000000000000ABCDEF 0010 flops=9223372036854775807 dev=2147483647 stream=4294967295 t=18446744073709551615\n",
        "t",
    )
    .unwrap();
    assert_eq!(
        evs[0],
        Event::alloc(0xabcdef, 10)
            .on_dev(i32::MAX as u32)
            .on_stream(u32::MAX)
            .at(u64::MAX)
            .with_flops(i64::MAX as u64)
    );
}

#[test]
fn the_briefs_message_format() {
    let e = err("# u3m-trace 1\nA 0x2000 16\n\n\n\n\n\n\n\n\n\nF 0x1000\n");
    assert_eq!(e.line, 12);
    assert_eq!(
        e.kind,
        ErrorKind::NotLiveStart {
            dev: 0,
            addr: 0x1000
        }
    );
    assert_eq!(
        e.to_string(),
        "trace.txt:12: F 0x1000: not the start of a live allocation"
    );
}

/// (trace text, line, message after "trace.txt:LINE: ")
const REJECTED: &[(&str, u64, &str)] = &[
    (
        "",
        1,
        "missing the header '# u3m-trace 1' (no non-empty line)",
    ),
    (
        "\n \n\t\n",
        3,
        "missing the header '# u3m-trace 1' (no non-empty line)",
    ),
    (
        "# u3m-trace 2\n",
        1,
        "expected the header '# u3m-trace 1' as the first non-empty line, found '# u3m-trace 2'",
    ),
    (
        "\n# u3m-trace 1 \n",
        2,
        "expected the header '# u3m-trace 1' as the first non-empty line, found '# u3m-trace 1 '",
    ),
    (
        "#  u3m-trace 1\n",
        1,
        "expected the header '# u3m-trace 1' as the first non-empty line, found '#  u3m-trace 1'",
    ),
    (
        "A 0x10 1\n# u3m-trace 1\n",
        1,
        "expected the header '# u3m-trace 1' as the first non-empty line, found 'A 0x10 1'",
    ),
    (
        "# u3m-trace 1\nX 0x10\n",
        2,
        "unknown event kind 'X': expected A, F, O, M or S",
    ),
    (
        "# u3m-trace 1\nAA 0x10 1\n",
        2,
        "unknown event kind 'AA': expected A, F, O, M or S",
    ),
    (
        "# u3m-trace 1\na 0x10 1\n",
        2,
        "unknown event kind 'a': expected A, F, O, M or S",
    ),
    ("# u3m-trace 1\nA\n", 2, "A: missing address"),
    ("# u3m-trace 1\nA 0x10\n", 2, "A: missing size"),
    ("# u3m-trace 1\nA 0x10 dev=1\n", 2, "A: missing size"),
    (
        "# u3m-trace 1\nA 16 1\n",
        2,
        "bad address '16': expected hexadecimal with a 0x prefix",
    ),
    (
        "# u3m-trace 1\nA 0x 1\n",
        2,
        "bad address '0x': expected hexadecimal with a 0x prefix",
    ),
    (
        "# u3m-trace 1\nA 0xg 1\n",
        2,
        "bad address '0xg': expected hexadecimal with a 0x prefix",
    ),
    (
        "# u3m-trace 1\nA 0x10000000000000000 1\n",
        2,
        "bad address '0x10000000000000000': expected hexadecimal with a 0x prefix",
    ),
    (
        "# u3m-trace 1\nA 0x10 -1\n",
        2,
        "bad size '-1': expected a decimal number",
    ),
    (
        "# u3m-trace 1\nA 0x10 0x10\n",
        2,
        "bad size '0x10': expected a decimal number",
    ),
    (
        "# u3m-trace 1\nA 0x10 18446744073709551616\n",
        2,
        "bad size '18446744073709551616': expected a decimal number",
    ),
    (
        "# u3m-trace 1\nA 0x10 1 extra\n",
        2,
        "unexpected field 'extra' (expected key=value)",
    ),
    (
        "# u3m-trace 1\nA 0x10 1 =x\n",
        2,
        "unexpected field '=x' (expected key=value)",
    ),
    (
        "# u3m-trace 1\nA 0x10 1 dev=x\n",
        2,
        "bad value in 'dev=x': expected a decimal number",
    ),
    (
        "# u3m-trace 1\nA 0x10 1 dev=\n",
        2,
        "bad value in 'dev=': expected a decimal number",
    ),
    (
        "# u3m-trace 1\nA 0x10 1 dev=2147483648\n",
        2,
        "dev=2147483648 out of range (at most 2147483647)",
    ),
    (
        "# u3m-trace 1\nA 0x10 1 stream=4294967296\n",
        2,
        "stream=4294967296 out of range (at most 4294967295)",
    ),
    (
        "# u3m-trace 1\nA 0x10 1 flops=9223372036854775808\n",
        2,
        "flops=9223372036854775808 out of range (at most 9223372036854775807)",
    ),
    (
        "# u3m-trace 1\nA 0x10 1 t=-1\n",
        2,
        "bad value in 't=-1': expected a decimal number",
    ),
    (
        "# u3m-trace 1\nA 0x10 1 tag=\n",
        2,
        "empty tag= (expected a word)",
    ),
    (
        // a \r inside the line (fuzzing found it): the writer would put it
        // at the line's end, where a reader takes it for a CRLF
        "# u3m-trace 1\nA 0x10 1 tag=act\r note=x\n",
        2,
        "tag=\"act\\r\" has a control character (expected a word)",
    ),
    (
        "# u3m-trace 1\nA 0xffffffffffffffff 1\n",
        2,
        "A 0xffffffffffffffff 1: range wraps around the address space",
    ),
    (
        "# u3m-trace 1\nA 0xfffffffffffffff0 16\n",
        2,
        "A 0xfffffffffffffff0 16: range wraps around the address space",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nA 0x100f 1\n",
        3,
        "A 0x100f 1: overlaps the live allocation 0x1000 16",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nA 0xff0 17\n",
        3,
        "A 0xff0 17: overlaps the live allocation 0x1000 16",
    ),
    (
        "# u3m-trace 1\nA 0x1000 0\nA 0x1000 0\n",
        3,
        "A 0x1000 0: overlaps the live allocation 0x1000 0",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16 dev=3\nA 0x1008 4 dev=3\n",
        3,
        "A 0x1008 4: overlaps the live allocation 0x1000 16 on device 3",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nF 0x1008\n",
        3,
        "F 0x1008: not the start of a live allocation",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nF 0x1000 dev=1\n",
        3,
        "F 0x1000: not the start of a live allocation on device 1",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nF 0x1000\nF 0x1000\n",
        4,
        "F 0x1000: not the start of a live allocation",
    ),
    ("# u3m-trace 1\nF\n", 2, "F: missing address"),
    (
        "# u3m-trace 1\nS 0x1000 1\n",
        2,
        "S 0x1000:1 is not inside one live allocation",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nS 0x1008 9\n",
        3,
        "S 0x1008:9 is not inside one live allocation",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nS 0x1011 0\n",
        3,
        "S 0x1011:0 is not inside one live allocation",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nA 0x1010 16\nS 0x1008 16\n",
        4,
        "S 0x1008:16 is not inside one live allocation",
    ),
    ("# u3m-trace 1\nM\n", 2, "M: missing copy kind"),
    (
        "# u3m-trace 1\nM D2X 0x1 0x2 3\n",
        2,
        "M: unknown copy kind 'D2X': expected H2D, D2H, D2D or H2H",
    ),
    (
        "# u3m-trace 1\nM h2d 0x1 0x2 3\n",
        2,
        "M: unknown copy kind 'h2d': expected H2D, D2H, D2D or H2H",
    ),
    ("# u3m-trace 1\nM H2H 0x1 0x2\n", 2, "M: missing size"),
    ("# u3m-trace 1\nM H2H 0x1\n", 2, "M: missing source address"),
    (
        "# u3m-trace 1\nM H2D 0x1 0x2 3\n",
        2,
        "M H2D: destination 0x1:3 is not inside one live allocation",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nM D2H 0x1000 0x2000 3\n",
        3,
        "M D2H: source 0x2000:3 is not inside one live allocation",
    ),
    (
        "# u3m-trace 1\nA 0x1000 16\nM D2D 0x1000 0x1008 9\n",
        3,
        "M D2D: source 0x1008:9 is not inside one live allocation",
    ),
    ("# u3m-trace 1\nO\n", 2, "O: missing op_type"),
    ("# u3m-trace 1\nO a=b 0 0\n", 2, "O: missing op_type"),
    ("# u3m-trace 1\nO Add\n", 2, "O: missing n_in"),
    ("# u3m-trace 1\nO Add 1\n", 2, "O: missing n_out"),
    (
        "# u3m-trace 1\nO Add x 0\n",
        2,
        "bad n_in 'x': expected a decimal number",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 1 1 0x10:1\n",
        3,
        "O Add: n_in=1 n_out=1 but 1 range(s) follow",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 1 0 0x10:1 0x10:1\n",
        3,
        "O Add: n_in=1 n_out=0 but 2 range(s) follow",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 0 1 0x10:1 dev=0 0x10:1\n",
        3,
        "unexpected field '0x10:1' (expected key=value)",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 0 2 0x10:1 dev=0 0x10:1\n",
        3,
        "O Add: n_in=0 n_out=2 but 1 range(s) follow",
    ),
    (
        "# u3m-trace 1\nO Add 1000001 0\n",
        2,
        "O Add: n_in=1000001 n_out=0 but 0 range(s) follow (at most 1000000 of each)",
    ),
    (
        "# u3m-trace 1\nO Add 18446744073709551615 1\n",
        2,
        "O Add: n_in=18446744073709551615 n_out=1 but 0 range(s) follow (at most 1000000 of each)",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 1 0 0x10\n",
        3,
        "bad range '0x10': expected <0xaddr>:<bytes>",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 1 0 0x10:\n",
        3,
        "bad range '0x10:': expected <0xaddr>:<bytes>",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 1 0 16:1\n",
        3,
        "bad range '16:1': expected <0xaddr>:<bytes>",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 1 0 0x10:1:2\n",
        3,
        "bad range '0x10:1:2': expected <0xaddr>:<bytes>",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 1 1 0x10:16 0x10:17\n",
        3,
        "O Add: output 0 0x10:17 is not inside one live allocation",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 2 0 0x10:16 0x20:1\n",
        3,
        "O Add: input 1 0x20:1 is not inside one live allocation",
    ),
    (
        "# u3m-trace 1\nA 0x10 16\nO Add 1 0 0x10:1 dev=1\n",
        3,
        "O Add: input 0 0x10:1 is not inside one live allocation on device 1",
    ),
    ("# u3m-trace 1\nA 0x10 1\0\n", 2, "NUL byte in line"),
];

#[test]
fn every_rule_is_enforced_with_its_line_and_reason() {
    for (text, line, msg) in REJECTED {
        let e = err(text);
        assert_eq!(
            (e.line, e.kind.to_string().as_str()),
            (*line, *msg),
            "for {text:?}"
        );
        assert_eq!(e.to_string(), format!("trace.txt:{line}: {msg}"));
    }
}

#[test]
fn typed_errors() {
    assert_eq!(
        err("# u3m-trace 1\nA 0x1000 16 dev=1\nO Mm 1 1 0x1000:16 0x1000:32 dev=1\n").kind,
        ErrorKind::NotInside {
            dev: 1,
            role: Role::OpOutput {
                op: "Mm".into(),
                index: 0
            },
            range: Range::new(0x1000, 32)
        }
    );
    assert_eq!(
        err("# u3m-trace 1\nA 0x10 1 tag=\n").kind,
        ErrorKind::EmptyTag
    );
    let bytes: &[u8] = b"# u3m-trace 1\nA 0x10 1 tag=\xff\n";
    let e = TraceReader::new(bytes, "b").find_map(Result::err).unwrap();
    assert_eq!((e.line, e.kind), (2, ErrorKind::NotUtf8));
}

#[test]
fn long_tokens_are_shortened_in_messages() {
    let tok = "y".repeat(10_000);
    let e = err(&format!("# u3m-trace 1\nA 0x10 1 {tok}\n"));
    assert!(e.to_string().len() < 200, "{}", e);
}

#[test]
fn the_reader_stops_at_the_first_error_and_keeps_earlier_events() {
    let mut r = TraceReader::new(
        "# u3m-trace 1\nA 0x10 1\nF 0x10\nF 0x10\nA 0x10 1\n".as_bytes(),
        "x",
    );
    assert!(r.next().unwrap().is_ok());
    assert!(r.next().unwrap().is_ok());
    assert_eq!(r.line(), 3);
    assert_eq!(r.next().unwrap().unwrap_err().line, 4);
    assert!(r.next().is_none());
    assert!(r.next().is_none());
}

/// A trace generated on the fly: the reader must not need it all in memory.
struct Generated {
    n: u64,
    i: u64,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for Generated {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
            if self.i == 0 {
                self.buf.extend_from_slice(b"# u3m-trace 1\n");
            }
            if self.i < self.n {
                let a = 0x1000_0000 + (self.i % 64) * 0x10_0000;
                let line = format!(
                    "A {a:#x} 1048576\nO Op 1 1 {a:#x}:4096 {:#x}:4096 stream=3\nM D2H 0x7f00 {a:#x} 64\nF {a:#x}\n",
                    a + 4096
                );
                self.buf.extend_from_slice(line.as_bytes());
            }
            self.i += 1;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn streams_a_large_trace() {
    let n = 50_000;
    let g = Generated {
        n,
        i: 0,
        buf: Vec::new(),
        pos: 0,
    };
    assert_eq!(validate(BufReader::new(g), "gen").unwrap(), 4 * n);
}

#[test]
fn an_overlong_line_is_rejected_without_reading_it_all() {
    // A line of MAX_LINE + 10 bytes with no newline, produced lazily.
    struct Endless(usize);
    impl Read for Endless {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = out.len().min(self.0);
            out[..n].fill(b'x');
            self.0 -= n;
            Ok(n)
        }
    }
    let head: &[u8] = b"# u3m-trace 1\nA 0x10 1 ";
    let r = BufReader::new(head.chain(Endless(MAX_LINE + 10)));
    let e = TraceReader::new(r, "big").find_map(Result::err).unwrap();
    assert_eq!((e.line, e.kind), (2, ErrorKind::LineTooLong));
}
