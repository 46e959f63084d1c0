//! The stats segment's event ring (model in seqlock.rs): writers racing for
//! a two-slot ring (with three, the third laps the first) and a reader
//! tailing it; a record the reader accepts, during the race or after it,
//! must be the one written under its sequence number.
use crate::seqlock::{payload, Ring, SlotRead, Variant};
use loom::sync::Arc;
use loom::thread;

fn run(v: Variant, writers: usize) {
    loom::model(move || {
        let ring = Arc::new(Ring::new(v));
        let ws: Vec<_> = (0..writers)
            .map(|_| {
                let r = ring.clone();
                thread::spawn(move || r.write())
            })
            .collect();
        // the reader tails concurrently
        for q in 0..writers as u64 {
            if let SlotRead::Ok(p) = ring.read(q) {
                assert_eq!(p, payload(q), "torn record {q} read during the race");
            }
        }
        for w in ws {
            w.join().unwrap();
        }
        // and once every writer is done
        for q in 0..writers as u64 {
            if let SlotRead::Ok(p) = ring.read(q) {
                assert_eq!(
                    p,
                    payload(q),
                    "record {q} holds another's data after the race"
                );
            }
        }
    });
}

/// A reader reading record 0 while the writer laps the ring and rewrites
/// its slot with record 2.
fn lap_during_read(v: Variant) {
    loom::model(move || {
        let ring = Arc::new(Ring::new(v));
        ring.write();
        let r = ring.clone();
        let reader = thread::spawn(move || {
            if let SlotRead::Ok(p) = r.read(0) {
                assert_eq!(p, payload(0), "torn record 0 read during the race");
            }
        });
        ring.write();
        ring.write();
        reader.join().unwrap();
    });
}

#[test]
fn loom_a_read_racing_a_lap_is_never_torn() {
    lap_during_read(Variant::AsShipped);
}

#[test]
fn loom_event_ring_never_yields_a_torn_record() {
    run(Variant::AsShipped, 2);
}

/// Three writers on two slots: the third laps the first. Its CAS on the
/// slot's stamp is Acquire (writer.rs), so the lapped writer's data stores
/// are ordered before its own: no record holds another's data.
#[test]
fn loom_a_lapping_writer_leaves_a_consistent_record() {
    run(Variant::AsShipped, 3);
}

/// Negative control, and the finding this model made: with the CAS Relaxed
/// (as writer.rs had it) nothing orders the lapped writer's data stores
/// before the lapping writer's, so the slot can end up stamped for sequence
/// 2 and holding sequence 0's data, which a reader accepts.
#[test]
#[should_panic(expected = "holds another's data")]
fn loom_finds_the_inconsistent_record_of_a_relaxed_lapping_writer() {
    run(Variant::RelaxedCas, 3);
}

/// Negative control: a reader that does not look at the stamp again after
/// reading the data accepts a record a lapping writer is rewriting.
#[test]
#[should_panic(expected = "torn record")]
fn loom_finds_the_torn_read_of_a_reader_without_the_recheck() {
    lap_during_read(Variant::NoRecheck);
}
