//! The device deadline: a worker whose device stops answering is found, not waited on forever.
//!
//! A call into a chip that stopped answering never returns, and nothing else in the process can
//! interrupt it. So each worker marks its progress on a [`Beacon`]: when it starts a request, at
//! every prefill chunk boundary (1,024 tokens) and when it ends. A watchdog thread looks at every
//! busy worker a few times per deadline; one that has made no progress for longer than the
//! deadline makes the engine *hung*, for good:
//! - the watchdog answers that worker's requests (one, or a packed pass's) with a 503 (the worker never will; should it
//!   come back after all, its late answer is dropped), and every queued request too;
//! - the engine refuses new requests ([`super::worker::SubmitError::DeviceHung`], a 503 with
//!   `Retry-After`) and `/health` answers 503 with the reason, so a balancer takes the replica
//!   out;
//! - the server exits non-zero after its drain window (`serve`), so its supervisor restarts it
//!   (and resets the chips).
//!
//! The deadline bounds the time between two progress marks, which on a P150x2 is one chunk's
//! device work (the port measured 338 ms for 1,024 tokens of Clef 27B) or a request's vision
//! tower, plus the compilation of programs a new shape needs on a cold kernel cache. The
//! warm-up is not bounded (tt-model waits hours for a first start that compiles everything).

use super::Decision;
use crate::request::RequestError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Where a running request's answer goes.
pub type Reply = oneshot::Sender<Result<Decision, RequestError>>;

/// The `kind` of the 503 a hung device answers with.
pub const DEVICE_UNAVAILABLE: &str = "device_unavailable";

/// One worker's progress, and the replies of the requests it runs (one, or the requests of a
/// packed pass).
#[derive(Default)]
pub struct Beacon {
    /// Requests the deadline bounds are running (not the warm-up, not idle).
    bounded: AtomicBool,
    /// Milliseconds since the deadline's epoch when the worker last made progress.
    last_beat: AtomicU64,
    replies: Mutex<Vec<Option<Reply>>>,
}

impl Beacon {
    /// The answers of the requests now running, those the watchdog has not taken.
    pub fn take_replies(&self) -> Vec<Option<Reply>> {
        self.replies
            .lock()
            .map(|mut r| r.iter_mut().map(Option::take).collect())
            .unwrap_or_default()
    }

    /// Running request `member`'s answer, unless the watchdog took it.
    pub fn take_reply(&self, member: usize) -> Option<Reply> {
        self.replies
            .lock()
            .ok()
            .and_then(|mut r| r.get_mut(member).and_then(Option::take))
    }

    /// True when nobody waits for running request `member` any more: its client left, or
    /// the watchdog answered it.
    pub fn client_gone(&self, member: usize) -> bool {
        self.replies.lock().map_or(true, |r| {
            r.get(member)
                .is_none_or(|r| r.as_ref().is_none_or(|r| r.is_closed()))
        })
    }
}

/// The workers' beacons, the deadline and, once it was missed, why.
pub struct DeviceDeadline {
    /// `None`: no deadline (the watchdog is not started).
    pub limit: Option<Duration>,
    epoch: Instant,
    beacons: Vec<Beacon>,
    hung: OnceLock<String>,
}

impl DeviceDeadline {
    pub fn new(workers: usize, limit: Option<Duration>) -> Self {
        DeviceDeadline {
            limit,
            epoch: Instant::now(),
            beacons: (0..workers).map(|_| Beacon::default()).collect(),
            hung: OnceLock::new(),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn beacon(&self, worker: usize) -> Option<&Beacon> {
        self.beacons.get(worker)
    }

    /// Worker `worker` starts requests whose answers go to `replies` (none: the warm-up, which
    /// no deadline bounds).
    pub fn begin(&self, worker: usize, replies: Vec<Reply>) {
        if let Some(b) = self.beacon(worker) {
            let bounded = !replies.is_empty();
            if let Ok(mut slot) = b.replies.lock() {
                *slot = replies.into_iter().map(Some).collect();
            }
            b.last_beat.store(self.now(), Ordering::SeqCst);
            b.bounded.store(bounded, Ordering::SeqCst);
        }
    }

    /// Worker `worker` made progress.
    pub fn beat(&self, worker: usize) {
        if let Some(b) = self.beacon(worker) {
            b.last_beat.store(self.now(), Ordering::SeqCst);
        }
    }

    /// Worker `worker` is done with its requests: the replies the watchdog did not answer.
    pub fn end(&self, worker: usize) -> Vec<Option<Reply>> {
        let Some(b) = self.beacon(worker) else {
            return Vec::new();
        };
        b.bounded.store(false, Ordering::SeqCst);
        b.take_replies()
    }

    /// Why the engine is hung, once it is.
    pub fn hung(&self) -> Option<&str> {
        self.hung.get().map(String::as_str)
    }

    /// The 503 every request gets once the engine is hung.
    pub fn unavailable(reason: &str) -> RequestError {
        RequestError::status(
            503,
            format!("the device stopped answering ({reason}); retry on another replica"),
            DEVICE_UNAVAILABLE,
        )
    }

    /// One look at every worker (the watchdog's tick): the first busy one past the deadline
    /// makes the engine hung, and its request is answered. Returns whether the engine is hung.
    pub fn check(&self) -> bool {
        let Some(limit) = self.limit else {
            return self.hung().is_some();
        };
        if self.hung().is_some() {
            return true;
        }
        let now = self.now();
        for (i, b) in self.beacons.iter().enumerate() {
            let bounded = b.bounded.load(Ordering::SeqCst);
            let last = b.last_beat.load(Ordering::SeqCst);
            let quiet = Duration::from_millis(now.saturating_sub(last));
            if !bounded || quiet <= limit {
                continue;
            }
            let reason = format!(
                "worker {i} has waited {:.1} s on its device, past the {} s deadline (CLEF_DEVICE_TIMEOUT)",
                quiet.as_secs_f64(),
                limit.as_secs_f64()
            );
            if self.hung.set(reason).is_ok() {
                tracing::error!(
                    worker = i,
                    "device deadline missed: {}",
                    self.hung().unwrap_or("")
                );
            }
            for reply in b.take_replies().into_iter().flatten() {
                let _ = reply.send(Err(Self::unavailable(self.hung().unwrap_or_default())));
            }
            return true;
        }
        false
    }

    /// How often the watchdog looks: a tenth of the deadline, between 50 ms and 1 s.
    pub fn tick(&self) -> Duration {
        self.limit
            .map_or(Duration::from_secs(1), |l| l / 10)
            .clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}
