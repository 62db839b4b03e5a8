//! `$ratelimit_status`: what happened to a main request, for the variables and the metrics.

/// What happened to a main request; read by the variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pending,
    Skipped,
    Passed,
    /// Admitted after waiting for its turn (`delay=`), recorded in Redis at that instant.
    Delayed,
    /// Admitted from units this worker reserved in Redis earlier (`lease=`), without asking.
    PassedLease,
    Rejected,
    /// Rejected by this worker's memory of an earlier rejection, without asking Redis.
    RejectedCached,
    /// Decided by this worker alone under `ratelimit_fail local`, Redis being unusable.
    PassedLocal,
    RejectedLocal,
    FailedOpen,
    FailedClosed,
    /// `ratelimit_dry_run`: Redis (or the local fallback) rejected it, and it was let through.
    RejectedDryRun,
}

impl Status {
    pub fn as_bytes(self) -> &'static [u8] {
        match self {
            Status::Pending => b"PENDING",
            Status::Skipped => b"SKIPPED",
            Status::Passed => b"PASSED",
            Status::PassedLease => b"PASSED_LEASE",
            Status::Delayed => b"DELAYED",
            Status::Rejected => b"REJECTED",
            Status::RejectedCached => b"REJECTED_CACHED",
            Status::PassedLocal => b"PASSED_LOCAL",
            Status::RejectedLocal => b"REJECTED_LOCAL",
            Status::FailedOpen => b"FAILED_OPEN",
            Status::FailedClosed => b"FAILED_CLOSED",
            Status::RejectedDryRun => b"REJECTED_DRY_RUN",
        }
    }
}
