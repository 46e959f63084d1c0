//! docs/host-optimizer.md, "Exactness": a host AdamW that computes the
//! simulator's ApplyAdamWV2 formula (double, same operations and order,
//! one rounding to float at the end) equals the simulated device's update
//! bit for bit; the same update computed in float does not (which is what
//! makes the comparison able to fail).

mod common;
use common::run;

#[test]
fn the_simulators_adamw_formula_on_the_host_is_bit_exact_and_float_is_not() {
    let r = run("adamw_exact", &["65536", "3"], &[]).must_succeed();
    assert_eq!(r.fact("elements").as_deref(), Some("65536"), "{}", r.stdout);
    for k in ["var", "m", "v"] {
        assert_eq!(
            r.fact(&format!("{k}_sim_diff")).as_deref(),
            Some("0"),
            "{}",
            r.stdout
        );
    }
    let f32_diff: u64 = r.fact("f32_diff").unwrap().parse().unwrap();
    assert!(f32_diff > 0, "{}", r.stdout);
}
