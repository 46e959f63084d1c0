//! The use fences' slot (model in fence_slot.rs): a call launches on
//! stream 1 and joins its open fence without the list's lock while another
//! thread settles that fence and opens another stream's fence in the same
//! slot. A fence a call joined must be the one of its stream, recorded after
//! the call's launch.
use crate::fence_slot::{Fences, Variant};
use loom::sync::atomic::Ordering::Relaxed;
use loom::sync::Arc;
use loom::thread;

fn run(v: Variant) {
    loom::model(move || {
        let f = Arc::new(Fences::new(v));
        f.open(1, 100);
        let c = f.clone();
        let call = thread::spawn(move || {
            // the call's launch, then its finish
            c.launched.store(1, Relaxed);
            c.join(1)
        });
        let seen = f.settle(100);
        f.open(2, 200);
        if let Some(ev) = call.join().unwrap() {
            assert_eq!(ev, 100, "a call on stream 1 joined stream 2's fence");
            assert_eq!(
                seen,
                Some(1),
                "a fence was recorded before the launch of a call that joined it"
            );
        }
    });
}

#[test]
fn loom_a_joined_fence_is_recorded_after_the_launch() {
    run(Variant::AsShipped);
}

#[test]
#[should_panic(expected = "recorded before the launch")]
fn loom_a_join_that_ignores_open_is_caught() {
    run(Variant::NoOpenCheck);
}

#[test]
#[should_panic(expected = "recorded before the launch")]
fn loom_a_relaxed_join_is_caught() {
    run(Variant::Relaxed);
}
