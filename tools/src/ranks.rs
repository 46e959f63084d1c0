//! Who a process is in a distributed job: the node and rank labels its
//! segment carries (layout 1.1: torchrun's RANK / LOCAL_RANK / WORLD_SIZE,
//! the node name). `stat` and `top` group processes by node, then rank.

use u3m_core::shm::Snapshot;

/// Sort key: node, then rank (unranked processes last), then pid.
pub fn order(s: &Snapshot) -> (String, u64, u32) {
    (
        s.label("node").to_string(),
        s.label("rank").parse().unwrap_or(u64::MAX),
        s.pid,
    )
}

/// `rank 1/2 (local 1)`, or None for a process launched without ranks.
pub fn rank_text(s: &Snapshot) -> Option<String> {
    let rank = s.label("rank");
    if rank.is_empty() {
        return None;
    }
    let mut t = format!("rank {rank}");
    let world = s.label("world_size");
    if !world.is_empty() {
        t.push('/');
        t.push_str(world);
    }
    let local = s.label("local_rank");
    if !local.is_empty() {
        t.push_str(&format!(" (local {local})"));
    }
    Some(t)
}

/// Indices of `snaps` in group order, each with the node heading to print
/// before it (the first of each node).
pub fn grouped<'a>(snaps: impl Iterator<Item = &'a Snapshot>) -> Vec<(usize, Option<String>)> {
    let mut idx: Vec<(usize, (String, u64, u32))> =
        snaps.enumerate().map(|(i, s)| (i, order(s))).collect();
    idx.sort_by(|a, b| a.1.cmp(&b.1));
    let mut out = Vec::with_capacity(idx.len());
    let mut last: Option<String> = None;
    for (i, (node, _, _)) in idx {
        let head = (last.as_deref() != Some(node.as_str()) && !node.is_empty())
            .then(|| format!("node {node}"));
        last = Some(node);
        out.push((i, head));
    }
    out
}
