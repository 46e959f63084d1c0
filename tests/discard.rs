//! u3m_discard (docs/api.md): a program that says a buffer's contents are
//! dead lets u3m drop it from HBM without a copy-out; every byte the
//! program writes afterwards reads back as written, and without libu3m.so
//! the hint is simply absent.

mod common;
use common::{run, tier};

const ARGS: [&str; 2] = ["--bytes", "32M"];
/// Room for one of the two buffers (and the runtime's own): the second
/// one's fill evicts the first.
const HBM: (&str, &str) = ("ACLSIM_HBM_BYTES", "48M");

fn copied_out(s: &serde_json::Value) -> u64 {
    s["tier"]["eviction_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("{s}"))
}

#[test]
fn a_discarded_buffer_leaves_hbm_without_a_copy_out() {
    let (keep, ks) = tier("discard_app", &ARGS, &[HBM]);
    let kept = keep.must_succeed();
    let mut args = ARGS.to_vec();
    args.push("--discard");
    let (drop, ds) = tier("discard_app", &args, &[HBM]);
    let dropped = drop.must_succeed();
    for r in [&kept, &dropped] {
        assert_eq!(r.fact("api").as_deref(), Some("present"), "{}", r.stdout);
        assert_eq!(r.fact("x_ok").as_deref(), Some("1"), "{}", r.stdout);
        assert_eq!(r.fact("y_ok").as_deref(), Some("1"), "{}", r.stdout);
    }
    assert_eq!(dropped.fact("discard_rc").as_deref(), Some("0"));
    assert_eq!(dropped.fact("null_rc").as_deref(), Some("100000"));
    // without the hint X's 32 MiB are copied out when Y needs HBM
    assert!(copied_out(&ks) >= 16 << 20, "{ks}");
    // with it, none of X's chunks is (Y's may be, when X comes back)
    assert!(
        copied_out(&ds) + (16 << 20) <= copied_out(&ks),
        "with the hint {} bytes copied out, without {}",
        copied_out(&ds),
        copied_out(&ks)
    );
    assert!(ds["tier"]["clean_drops"].as_u64().unwrap() >= 8, "{ds}");
}

#[test]
fn without_libu3m_the_hint_is_absent_and_nothing_changes() {
    let mut args = ARGS.to_vec();
    args.push("--discard");
    let r = run("discard_app", &args, &[("ACLSIM_HBM_BYTES", "1G")]).must_succeed();
    assert_eq!(r.fact("api").as_deref(), Some("absent"), "{}", r.stdout);
    assert_eq!(r.fact("discard_rc"), None);
    assert_eq!(r.fact("x_ok").as_deref(), Some("1"));
    assert_eq!(r.fact("y_ok").as_deref(), Some("1"));
}
