//! The fuzz targets' checks (fuzz/fuzz_targets/checks.rs) on every input
//! committed under fuzz/corpus/ and fuzz/regressions/, in the ordinary test
//! run: a crash found by ci/fuzz.sh is fixed and its input saved to
//! fuzz/regressions/<target>/, and from then on this test replays it.
//! (Inputs of open findings, fuzz/known/, are replayed by ci/fuzz.sh
//! --known instead: they still crash.)

#[allow(dead_code, clippy::all)]
#[path = "../fuzz/fuzz_targets/checks.rs"]
mod checks;

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut n = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(rd) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        let mut files: Vec<_> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files.into_iter().filter(|f| f.is_file()) {
            let data = std::fs::read(&f).unwrap();
            let r = std::panic::catch_unwind(|| check(&data));
            assert!(r.is_ok(), "{target}: {} fails", f.display());
            n += 1;
        }
    }
    n
}

#[test]
fn trace_reader_corpus() {
    assert!(replay("trace_reader", checks::trace_reader) >= 5);
}

#[test]
fn config_corpus() {
    assert!(replay("config", checks::config) >= 3);
}

#[test]
fn stats_segment_corpus() {
    assert!(replay("stats_segment", checks::stats_segment) >= 3);
}
