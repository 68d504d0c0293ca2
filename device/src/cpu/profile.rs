//! Optional per-op wall-time accounting of the CPU backend (for `bench prefill --op-times`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug, Default)]
pub struct OpProfile {
    totals: Mutex<BTreeMap<&'static str, (f64, u64)>>,
}

impl OpProfile {
    pub fn start(&self, op: &'static str) -> Timer<'_> {
        Timer {
            profile: self,
            op,
            started: Instant::now(),
        }
    }

    pub fn report(&self) -> Vec<(&'static str, f64, u64)> {
        let totals = match self.totals.lock() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let mut rows: Vec<_> = totals.into_iter().map(|(k, (s, n))| (k, s, n)).collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        rows
    }
}

/// Adds its lifetime to its op when dropped.
pub struct Timer<'a> {
    profile: &'a OpProfile,
    op: &'static str,
    started: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed().as_secs_f64();
        if let Ok(mut t) = self.profile.totals.lock() {
            let e = t.entry(self.op).or_insert((0.0, 0));
            e.0 += elapsed;
            e.1 += 1;
        }
    }
}
