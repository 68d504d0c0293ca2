//! The per-worker prefix cache: decision clients ask many question sets about one state, so a
//! worker keeps, for a few recent states, everything a repeat needs at the cached length P —
//! the backbone's state (KV rows of every full-attention layer, conv and recurrent state of
//! every DeltaNet layer) and the head's memory rows of positions `< P` — and a hit computes
//! only the tail rows, for the backbone and the head alike.
//!
//! A slot is keyed by the media digest and the token ids `[0, P)`; the served model is implied
//! (one cache per pipeline, one model per pipeline). P is chosen by [`boundary`]. Slots are
//! inserted whole, after their prefix pass succeeded, and evicted least recently used first,
//! by count and by bytes. Hits, misses, evictions and bytes are counted in
//! [`PrefixCacheStats`], shared by every worker of a server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Cached lengths are multiples of this many tokens; shorter state pieces are not cached.
pub const PREFIX_ALIGN: usize = 128;

/// How a worker caches prefixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Slots per worker (0 disables the cache).
    pub slots: usize,
    /// Bytes all slots of this worker may hold together; the least recently used slots go
    /// first when a new one would pass it.
    pub max_bytes: Option<usize>,
    /// Pick P to minimise prefill passes (see [`boundary`]).
    pub planner: bool,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig {
            slots: 4,
            max_bytes: None,
            planner: false,
        }
    }
}

/// The cached length P for a prompt whose state piece ends at `state_end`, or `None` when the
/// state piece is too short to cache.
///
/// Default: the largest multiple of [`PREFIX_ALIGN`] not past `state_end`. With the planner:
/// the largest multiple of `chunk` (the prefill pass size) not past `state_end`, when there is
/// one, so the prefix splits into whole passes and a miss runs exactly as many passes as an
/// uncached prompt (`P/chunk + ⌈(T−P)/chunk⌉ = ⌈T/chunk⌉`); P never depends on the questions,
/// so every question set on one state shares the slot. Shorter states fall back to the default.
pub fn boundary(state_end: usize, chunk: usize, planner: bool) -> Option<usize> {
    if planner && chunk.is_multiple_of(PREFIX_ALIGN) && state_end >= chunk {
        return Some(state_end / chunk * chunk);
    }
    let p = state_end / PREFIX_ALIGN * PREFIX_ALIGN;
    (p >= PREFIX_ALIGN).then_some(p)
}

/// What a slot is found by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// Digest of the decoded media of the prompt (empty for text-only prompts).
    pub media: Vec<u8>,
    /// Prompt token ids `[0, P)`.
    pub ids: Vec<u32>,
}

impl CacheKey {
    pub fn text(ids: &[u32]) -> Self {
        CacheKey {
            media: Vec::new(),
            ids: ids.to_vec(),
        }
    }

    /// The cached length P.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// One cached prefix: the backbone state at P and the head's memory rows below P.
pub struct PrefixSlot<S, M> {
    pub key: CacheKey,
    pub state: S,
    pub memory: M,
    /// Bytes held by the state and the memory rows.
    pub bytes: usize,
}

/// Counters of all the caches of a server.
#[derive(Default, Debug)]
pub struct PrefixCacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    /// Bytes held by all slots now.
    pub bytes: AtomicU64,
}

/// How a request used the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheUse {
    /// The cache is disabled.
    Off,
    /// The state piece is shorter than [`PREFIX_ALIGN`] tokens.
    Uncacheable,
    Hit,
    Miss,
}

impl CacheUse {
    /// Every value (the `x-clef-prefix-cache` header's values in the OpenAPI document).
    pub const ALL: [CacheUse; 4] = [
        CacheUse::Off,
        CacheUse::Uncacheable,
        CacheUse::Hit,
        CacheUse::Miss,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CacheUse::Off => "off",
            CacheUse::Uncacheable => "uncacheable",
            CacheUse::Hit => "hit",
            CacheUse::Miss => "miss",
        }
    }
}

/// The slots of one worker, least recently used first.
pub struct PrefixCache<S, M> {
    config: PrefixCacheConfig,
    slots: Vec<Arc<PrefixSlot<S, M>>>,
    stats: Arc<PrefixCacheStats>,
}

impl<S, M> PrefixCache<S, M> {
    pub fn new(config: PrefixCacheConfig, stats: Arc<PrefixCacheStats>) -> Self {
        PrefixCache {
            config,
            slots: Vec::new(),
            stats,
        }
    }

    pub fn config(&self) -> PrefixCacheConfig {
        self.config
    }

    pub fn stats(&self) -> Arc<PrefixCacheStats> {
        self.stats.clone()
    }

    pub fn enabled(&self) -> bool {
        self.config.slots > 0
    }

    /// The slot for `key`, made the most recently used; counts a hit or a miss.
    pub fn lookup(&mut self, key: &CacheKey) -> Option<Arc<PrefixSlot<S, M>>> {
        match self.slots.iter().position(|s| &s.key == key) {
            Some(i) => {
                let slot = self.slots.remove(i);
                self.slots.push(slot.clone());
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                Some(slot)
            }
            None => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keep `slot` as the most recently used, evicting the least recently used ones while
    /// there are too many or they hold too many bytes. A slot larger than the byte cap on its
    /// own is not kept. Returns the slot for the caller's use either way.
    pub fn insert(&mut self, slot: PrefixSlot<S, M>) -> Arc<PrefixSlot<S, M>> {
        let slot = Arc::new(slot);
        if !self.enabled() || self.config.max_bytes.is_some_and(|cap| slot.bytes > cap) {
            return slot;
        }
        // A concurrent miss on the same key (not possible within one worker, but cheap to
        // guard) replaces the older copy.
        if let Some(i) = self.slots.iter().position(|s| s.key == slot.key) {
            let old = self.slots.remove(i);
            self.stats
                .bytes
                .fetch_sub(old.bytes as u64, Ordering::Relaxed);
        }
        let over = |slots: &[Arc<PrefixSlot<S, M>>], cap: Option<usize>| {
            slots.len() >= self.config.slots
                || cap
                    .is_some_and(|c| slots.iter().map(|s| s.bytes).sum::<usize>() + slot.bytes > c)
        };
        while !self.slots.is_empty() && over(&self.slots, self.config.max_bytes) {
            let old = self.slots.remove(0);
            self.stats
                .bytes
                .fetch_sub(old.bytes as u64, Ordering::Relaxed);
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        self.stats
            .bytes
            .fetch_add(slot.bytes as u64, Ordering::Relaxed);
        self.slots.push(slot.clone());
        slot
    }

    /// Cached lengths, least recently used first.
    pub fn lengths(&self) -> Vec<usize> {
        self.slots.iter().map(|s| s.key.len()).collect()
    }

    /// Bytes held by this worker's slots.
    pub fn bytes(&self) -> usize {
        self.slots.iter().map(|s| s.bytes).sum()
    }

    /// Drop every slot (counted as evictions): a worker replaced after a failure starts empty.
    pub fn clear(&mut self) {
        self.stats
            .bytes
            .fetch_sub(self.bytes() as u64, Ordering::Relaxed);
        self.stats
            .evictions
            .fetch_add(self.slots.len() as u64, Ordering::Relaxed);
        self.slots.clear();
    }
}

impl<S, M> Drop for PrefixCache<S, M> {
    fn drop(&mut self) {
        self.stats
            .bytes
            .fetch_sub(self.bytes() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(ids: &[u32], bytes: usize) -> PrefixSlot<(), ()> {
        PrefixSlot {
            key: CacheKey::text(ids),
            state: (),
            memory: (),
            bytes,
        }
    }

    #[test]
    fn boundaries_are_aligned_and_never_pass_the_state() {
        assert_eq!(boundary(127, 1024, false), None);
        assert_eq!(boundary(128, 1024, false), Some(128));
        assert_eq!(boundary(2200, 1024, false), Some(2176));
        assert_eq!(boundary(2200, 1024, true), Some(2048));
        // Under one pass the planner keeps the aligned default.
        assert_eq!(boundary(900, 1024, true), Some(896));
        assert_eq!(boundary(100, 1024, true), None);
        for end in [130, 1000, 1024, 5000, 16384] {
            for planner in [false, true] {
                let p = boundary(end, 1024, planner).unwrap_or(0);
                assert!(p <= end && p.is_multiple_of(PREFIX_ALIGN));
            }
        }
    }

    #[test]
    fn least_recently_used_slots_go_first() {
        let stats = Arc::new(PrefixCacheStats::default());
        let config = PrefixCacheConfig {
            slots: 2,
            ..Default::default()
        };
        let mut cache = PrefixCache::new(config, stats.clone());
        cache.insert(slot(&[1], 10));
        cache.insert(slot(&[2], 10));
        assert!(cache.lookup(&CacheKey::text(&[1])).is_some()); // 1 is now the newest
        cache.insert(slot(&[3], 10)); // evicts 2
        assert!(cache.lookup(&CacheKey::text(&[2])).is_none());
        assert_eq!(cache.lengths(), vec![1, 1]);
        assert!(cache.lookup(&CacheKey::text(&[1])).is_some());
        assert!(cache.lookup(&CacheKey::text(&[3])).is_some());
        assert_eq!(stats.hits.load(Ordering::Relaxed), 3);
        assert_eq!(stats.misses.load(Ordering::Relaxed), 1);
        assert_eq!(stats.evictions.load(Ordering::Relaxed), 1);
        assert_eq!(stats.bytes.load(Ordering::Relaxed), 20);
        drop(cache);
        assert_eq!(stats.bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_byte_cap_evicts_and_refuses_oversized_slots() {
        let stats = Arc::new(PrefixCacheStats::default());
        let config = PrefixCacheConfig {
            slots: 4,
            max_bytes: Some(25),
            planner: false,
        };
        let mut cache = PrefixCache::new(config, stats.clone());
        cache.insert(slot(&[1], 10));
        cache.insert(slot(&[2], 10));
        cache.insert(slot(&[3], 10)); // 30 > 25: slot 1 goes
        assert_eq!(cache.bytes(), 20);
        assert!(cache.lookup(&CacheKey::text(&[1])).is_none());
        cache.insert(slot(&[4], 26)); // alone over the cap: not kept, nothing evicted
        assert_eq!(cache.bytes(), 20);
        assert_eq!(stats.evictions.load(Ordering::Relaxed), 1);
        assert_eq!(stats.bytes.load(Ordering::Relaxed), 20);
    }

    #[test]
    fn a_disabled_cache_keeps_nothing() {
        let stats = Arc::new(PrefixCacheStats::default());
        let config = PrefixCacheConfig {
            slots: 0,
            ..Default::default()
        };
        let mut cache = PrefixCache::new(config, stats.clone());
        cache.insert(slot(&[1], 10));
        assert_eq!(cache.bytes(), 0);
        assert_eq!(stats.bytes.load(Ordering::Relaxed), 0);
    }
}
