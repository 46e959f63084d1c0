//! The heat table's generation-tagged records (core/src/heat/record.rs, the
//! real code): a toucher that looked a record up before a free can never add
//! to the next allocation's epoch, and concurrent touches are never lost.
use crate::opclass::OpClass;
use crate::record::{Hit, Record};
use loom::sync::Arc;
use loom::thread;

fn hit(seq: u64, t: u64, write: bool) -> Hit {
    Hit::new(seq, t << 20, write, OpClass::MatMul, 0x1234_5678_9abc_def0)
}

#[test]
fn loom_a_stale_touch_never_reaches_the_next_epoch() {
    loom::model(|| {
        let r = Arc::new(Record::default());
        let r2 = r.clone();
        // a toucher that looked the record up in epoch 1 ...
        let t = thread::spawn(move || r2.hit(1, &hit(7, 3, true)));
        // ... while the allocation is freed and the slot re-used (epoch 2)
        let old = r.swap_epoch(1, 2);
        let counted = t.join().unwrap();
        let new = r.read(2);
        assert_eq!(new.0, [0; 6], "epoch 2 got a stale touch: {:?}", new.0);
        // hit() says true exactly when its access is in epoch 1's totals
        assert_eq!(counted, old.0[0] == 1, "counted={counted} old={:?}", old.0);
        assert!(old.0[0] <= 1);
    });
}

#[test]
fn loom_concurrent_touches_are_all_counted() {
    loom::model(|| {
        let r = Arc::new(Record::default());
        let r2 = r.clone();
        let t = thread::spawn(move || assert!(r2.hit(0, &hit(9, 5, false))));
        assert!(r.hit(0, &hit(3, 2, true)));
        t.join().unwrap();
        let s = r.read(0).stats();
        assert_eq!(s.accesses, 2);
        assert_eq!(s.last_seq, 9);
        assert_eq!(s.first_ns, 2 << 20);
        assert_eq!(s.last_ns, 5 << 20);
        assert_eq!(s.last_write_seq, Some(3));
    });
}
