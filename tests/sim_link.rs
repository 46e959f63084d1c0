//! The simulator's host link is one shared, full-duplex resource per device
//! (docs/simulator.md, "Simulated time"): transfers that overlap in simulated
//! time share a direction's bandwidth; the two directions run in parallel.
//! ACLSIM_LINK_MODEL=per-stream gives every stream the whole link (the old
//! model).

mod common;

use common::{run, scratch};

const MIB: u64 = 1 << 20;

/// 16 MiB at 25 GB/s, rounded as the simulator rounds.
fn link_ns(bytes: u64) -> u64 {
    (bytes as f64 / 25.0).round() as u64
}

/// Runs `body` (trace lines after two 16 MiB allocations) under acl_replay;
/// returns (sim_ns, per-stream clocks, H2D busy ns, D2H busy ns).
fn replay(name: &str, body: &str, model: &str) -> (u64, Vec<u64>, u64, u64) {
    let dir = scratch(&format!("sim-link-{name}"));
    let text = format!(
        "# u3m-trace 1\nA 0x10000000 {n}\nA 0x20000000 {n}\n{body}",
        n = 16 * MIB
    );
    let path = dir.join(format!("{name}.trace"));
    std::fs::write(&path, text).unwrap();
    let mut env = vec![("ACLSIM_PRESET", "910b4")];
    if !model.is_empty() {
        env.push(("ACLSIM_LINK_MODEL", model));
    }
    let r = run("acl_replay", &["--no-verify", path.to_str().unwrap()], &env).must_succeed();
    let streams = r.stats["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sim_ns"].as_u64().unwrap())
        .collect();
    assert_eq!(
        r.stats["link_model"].as_str().unwrap(),
        if model.is_empty() { "shared" } else { model }
    );
    (
        r.stat_u64(&["sim_ns"]),
        streams,
        r.stats["devices"][0]["link_h2d_busy_ns"].as_u64().unwrap(),
        r.stats["devices"][0]["link_d2h_busy_ns"].as_u64().unwrap(),
    )
}

const TWO_H2D: &str = "M H2D 0x10000000 0x7f0000000000 16777216 stream=1\n\
                       M H2D 0x20000000 0x7f0001000000 16777216 stream=2\n";
const H2D_D2H: &str = "M H2D 0x10000000 0x7f0000000000 16777216 stream=1\n\
                       M D2H 0x7f0001000000 0x20000000 16777216 stream=2\n";

#[test]
fn copies_in_one_direction_on_two_streams_share_the_link() {
    let one = link_ns(16 * MIB);
    let (ns, streams, h2d, d2h) = replay("two-h2d", TWO_H2D, "");
    // both start at 0; together they need 2 x 16 MiB of the H2D direction
    assert_eq!(ns, 2 * one, "streams {streams:?}");
    assert_eq!((h2d, d2h), (2 * one, 0));
    let mut busy: Vec<u64> = streams.into_iter().filter(|&c| c > 0).collect();
    busy.sort();
    assert_eq!(
        busy,
        vec![one, 2 * one],
        "one copy first, the other after it"
    );
    // the old model: each stream had the whole link
    let (old, _, h2d, _) = replay("two-h2d-old", TWO_H2D, "per-stream");
    assert_eq!(old, one);
    assert_eq!(h2d, 0, "per-stream keeps no calendar");
}

#[test]
fn the_link_is_full_duplex() {
    let one = link_ns(16 * MIB);
    let (ns, streams, h2d, d2h) = replay("duplex", H2D_D2H, "");
    assert_eq!(ns, one, "H2D and D2H overlap: {streams:?}");
    assert_eq!((h2d, d2h), (one, one));
}

#[test]
fn a_copy_fills_the_link_time_others_left() {
    // stream 1: 16 MiB in, then 8 MiB in; stream 2: 16 MiB in. 40 MiB in
    // all: the H2D direction is busy without a gap until 40 MiB / link.
    let body = format!(
        "{TWO_H2D}M H2D 0x10000000 0x7f0002000000 {} stream=1\n",
        8 * MIB
    );
    let (ns, _, h2d, _) = replay("fill", &body, "");
    assert_eq!(h2d, 2 * link_ns(16 * MIB) + link_ns(8 * MIB));
    assert_eq!(ns, h2d, "no gap, no overlap");
}

#[test]
fn a_bad_link_model_is_refused() {
    let dir = scratch("sim-link-bad");
    let path = dir.join("t.trace");
    let text = format!(
        "# u3m-trace 1\nA 0x10000000 {n}\nA 0x20000000 {n}\n{TWO_H2D}",
        n = 16 * MIB
    );
    std::fs::write(&path, text).unwrap();
    let r = run(
        "acl_replay",
        &["--no-verify", path.to_str().unwrap()],
        &[("ACLSIM_LINK_MODEL", "half")],
    );
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("ACLSIM_LINK_MODEL"), "{}", r.stderr);
}
