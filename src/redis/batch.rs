//! Which queued decisions may share one script call, and what a call's errors mean for the
//! decisions in it.
//!
//! On one server any decisions may share a call. On a Cluster a call may declare keys of one
//! slot only, so batches used to be per slot, which with many consumers meant a call per
//! decision. A node's batch holds decisions of every slot the node serves: the first
//! decision's keys are declared, the script learns whether the node serves each of the others
//! from its first access, before its decision writes (`lua/decide.lua`), and one whose key is
//! not on the node after all (resharded, migrating, a server that refuses undeclared keys of
//! other slots) is answered `NOTLOCAL`, having written nothing, and is sent again alone with
//! its keys declared, where `MOVED` and `ASK` lead it.

/// What the batching rule needs of a queued decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// On a Cluster, the slot all its keys share (`None`: keys of several slots, or one server).
    pub slot: Option<u16>,
    /// Goes in a call of its own: after `ASK`, or sent again alone.
    pub alone: bool,
}

/// Whether `next` may join a call whose first decision is `head`. `per_node`: the call goes to
/// a Cluster node that takes undeclared keys of other slots.
pub fn joins(head: Shape, next: Shape, per_node: bool) -> bool {
    if head.alone || next.alone {
        return false;
    }
    head.slot == next.slot || per_node && head.slot.is_some() && next.slot.is_some()
}

/// The reply a decision of a node's batch gets when one of its keys is not on the node: the
/// script's `NOTLOCAL`, then Redis's error.
pub fn not_local(error: &[u8]) -> Option<&[u8]> {
    error.strip_prefix(b"NOTLOCAL ")
}

/// Redis's reason for `NOTLOCAL` when the node refuses any undeclared key of another slot
/// (Redis checks this where 7.0 did not): node batches to it cannot work, per-slot ones can.
pub fn refuses_other_slots(redis_error: &[u8]) -> bool {
    const CROSS: &[u8] = b"do not hash to the same slot";
    redis_error.windows(CROSS.len()).any(|w| w == CROSS)
}

/// Whether an error answering a whole call of several decisions is better met by sending each
/// again alone than by handing it to all: refused for one decision's keys (`NOPERM`), or in a
/// call of several slots (`mixed`), a redirection or refusal that concerns the declared keys,
/// those of the first decision, only. Nothing was applied in either case.
pub fn redo_alone(error: &[u8], mixed: bool) -> bool {
    if super::breaker::refused_keys(error) {
        return true;
    }
    mixed
        && [&b"MOVED "[..], b"ASK ", b"TRYAGAIN", b"CROSSSLOT"].iter().any(|p| error.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(slot: Option<u16>) -> Shape {
        Shape { slot, alone: false }
    }

    #[test]
    fn one_server_batches_everything_a_cluster_per_slot_or_per_node() {
        // One server: no slots.
        assert!(joins(shape(None), shape(None), false));
        // A Cluster, per slot.
        assert!(joins(shape(Some(7)), shape(Some(7)), false));
        assert!(!joins(shape(Some(7)), shape(Some(8)), false));
        // Per node: any slots, but never a decision whose own keys span slots.
        assert!(joins(shape(Some(7)), shape(Some(8)), true));
        assert!(!joins(shape(Some(7)), shape(None), true));
        assert!(!joins(shape(None), shape(Some(7)), true));
        // Alone is alone.
        let alone = Shape { slot: Some(7), alone: true };
        assert!(!joins(alone, shape(Some(7)), true));
        assert!(!joins(shape(Some(7)), alone, true));
    }

    #[test]
    fn not_local_and_its_reasons() {
        let moved = b"NOTLOCAL ERR Script attempted to access a non local key in a cluster node";
        assert_eq!(
            not_local(moved),
            Some(&b"ERR Script attempted to access a non local key in a cluster node"[..])
        );
        assert!(!refuses_other_slots(not_local(moved).unwrap()));
        let cross = b"ERR Script attempted to access keys that do not hash to the same slot";
        assert!(refuses_other_slots(cross));
        assert_eq!(not_local(b"ERR ratelimit: bad limit"), None);
        assert_eq!(not_local(b"NOTLOCALX"), None);
    }

    #[test]
    fn whole_call_errors_of_a_mixed_call_go_again_alone() {
        for e in ["MOVED 3300 127.0.0.1:7001", "ASK 3300 127.0.0.1:7001", "TRYAGAIN x", "CROSSSLOT"]
        {
            assert!(redo_alone(e.as_bytes(), true), "{e}");
            assert!(!redo_alone(e.as_bytes(), false), "{e}");
        }
        assert!(redo_alone(b"NOPERM No permissions to access a key", false));
        assert!(!redo_alone(b"NOSCRIPT No matching script", true));
        assert!(!redo_alone(b"CLUSTERDOWN The cluster is down", true));
    }
}
