//! HcclBatchSendRecv: the simulator pairs the ranks' sends and receives and
//! moves the data; under libu3m.so in tier mode every item's buffer is made
//! resident before the batch runs, however many items it has (u3m kept only
//! the first 64 items' buffers: the rest ran on memory it had evicted).

mod common;

use common::{run, tier};

const TWO: (&str, &str) = ("ACLSIM_DEVICES", "2");

#[test]
fn a_batch_swaps_buffers_between_two_ranks() {
    let r = run(
        "batch_sendrecv_app",
        &["--items", "80", "--bytes", "64K"],
        &[TWO],
    )
    .must_succeed();
    assert_eq!(
        r.fact("received_ok").as_deref(),
        Some("160"),
        "{}",
        r.stdout
    );
    assert_eq!(r.fact("mismatches").as_deref(), Some("0"));
}

#[test]
fn a_batch_of_160_items_runs_on_resident_memory_under_pressure() {
    let args = ["--items", "80", "--fill", "100"];
    let big = run(
        "batch_sendrecv_app",
        &args,
        &[TWO, ("ACLSIM_HBM_BYTES", "2G")],
    )
    .must_succeed();
    let small = [TWO, ("ACLSIM_HBM_BYTES", "384M")];
    let stock = run("batch_sendrecv_app", &args, &small);
    assert_eq!(stock.code, 2, "stock at 384 MiB runs out: {}", stock.stderr);
    assert!(stock.stderr.contains("207001"), "{}", stock.stderr);

    let (r, s) = tier("batch_sendrecv_app", &args, &small);
    assert!(
        !r.stderr.contains("MMU fault") && !r.stderr.contains("belongs to device"),
        "u3m let the batch touch memory it had not made resident, or used a \
         stream of another device:\n{}",
        r.stderr
    );
    let r = r.must_succeed();
    assert_eq!(
        r.fact("received_ok").as_deref(),
        Some("160"),
        "{}",
        r.stdout
    );
    assert_eq!(r.fact("checksum"), big.fact("checksum"));
    // the pressure was real: sources were evicted and brought back
    let t = &s["tier"];
    assert!(t["evictions"].as_u64().unwrap_or(0) >= 100, "summary: {s}");
    assert!(t["faults_in"].as_u64().unwrap_or(0) >= 64, "summary: {s}");
}
