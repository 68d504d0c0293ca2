//! The prefix cache on the tiny fixture: a repeated request is bitwise identical to its first
//! answer (short, 1k- and 4k-token states, truncated states, other question sets on one state,
//! the 1x2 mesh, through the Tenstorrent shim), both equal an uncached pipeline within the
//! goldens' tolerance; LRU order and eviction; slot bytes as estimated; a cancelled prefill
//! leaves no slot behind.

mod common;

use clef_device::cpu::CpuMesh;
use clef_device::tt::TtMesh;
use clef_device::{MeshOps, MeshShape, WeightFormat};
use clef_tt::checkpoint::Checkpoint;
use clef_tt::encode::LengthRule;
use clef_tt::engine::prefix_cache::{CacheUse, PrefixCacheConfig, PrefixCacheStats};
use clef_tt::engine::{Decision, Pipeline};
use clef_tt::request::validate;
use serde_json::{json, Value};
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const SERVER: LengthRule = LengthRule::Server {
    max_state: 16384,
    max_tail: 4096,
    truncate: false,
};

fn pipeline(mesh: MeshShape, slots: usize) -> (Pipeline<CpuMesh>, Arc<PrefixCacheStats>) {
    pipeline_on(CpuMesh::new(mesh), slots)
}

/// The fixture's pipeline on the host shim's Tenstorrent mesh.
fn tt_pipeline(mesh: MeshShape, slots: usize) -> (Pipeline<TtMesh>, Arc<PrefixCacheStats>) {
    pipeline_on(common::tt_mesh(mesh, Default::default()), slots)
}

fn pipeline_on<B: MeshOps>(mesh: B, slots: usize) -> (Pipeline<B>, Arc<PrefixCacheStats>) {
    let ckpt = Checkpoint::open(&common::fixtures().join("tiny-clef")).unwrap();
    let stats = Arc::new(PrefixCacheStats::default());
    let p = Pipeline::new(&ckpt, mesh, WeightFormat::F32)
        .unwrap()
        .with_prefix_cache(
            PrefixCacheConfig {
                slots,
                ..Default::default()
            },
            stats.clone(),
        );
    (p, stats)
}

/// A state of roughly `words` words, different per `seed`.
fn state(words: usize, seed: usize) -> String {
    common::state_words(words, seed)
}

fn questions(set: usize) -> Value {
    match set {
        0 => json!({
            "team": {"type": "choice", "instructions": "Which team owns this?",
                     "criteria": {"billing": "Billing and refunds", "infra": "Servers and outages", "auth": "Logins"}},
            "urgent": {"type": "noul", "instructions": "Is it urgent?"},
            "severity": {"type": "score", "instructions": "How severe is it?", "criteria": ["low", "medium", "high"]}
        }),
        _ => json!({
            "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
            "channel": {"type": "choice", "instructions": "Where should it go?",
                        "criteria": {"email": "Reply by email", "phone": "Call back"}}
        }),
    }
}

fn decide<B: MeshOps>(p: &Pipeline<B>, state: &str, set: usize, truncate: bool) -> Decision {
    let body =
        json!({"model": "clef", "state": state, "questions": questions(set), "truncate": truncate});
    let req = validate(&body, None).unwrap();
    p.decide(&req, SERVER).unwrap()
}

fn bits(d: &Decision) -> Vec<Vec<u32>> {
    d.logits
        .iter()
        .map(|q| q.iter().map(|l| l.to_bits()).collect())
        .collect()
}

/// Miss then hit on `p` must be bitwise equal; both within 1e-4 of the uncached logits.
fn check_hit_equals_miss<B: MeshOps, U: MeshOps>(
    p: &Pipeline<B>,
    uncached: &Pipeline<U>,
    state: &str,
    set: usize,
) {
    let miss = decide(p, state, set, false);
    assert_eq!(miss.cache, CacheUse::Miss, "first request");
    let hit = decide(p, state, set, false);
    assert_eq!(hit.cache, CacheUse::Hit, "repeat");
    assert_eq!(bits(&hit), bits(&miss), "hit and miss logits differ");
    assert_eq!(hit.response, miss.response);
    let plain = decide(uncached, state, set, false);
    assert_eq!(plain.cache, CacheUse::Off);
    assert_eq!(plain.record, hit.record);
    for (a, b) in plain
        .logits
        .iter()
        .flatten()
        .zip(hit.logits.iter().flatten())
    {
        assert!((a - b).abs() <= 1e-4, "cached {b} vs uncached {a}");
    }
}

#[test]
fn a_repeated_state_is_bitwise_identical_to_its_miss() {
    repeated_states_hit(|slots| pipeline(MeshShape::ONE, slots));
}

/// Through the Tenstorrent C ABI: the slot's KV and DeltaNet states stay on the device (handles
/// the next pass reads), and a hit is still bitwise its miss, on 1x1 and 1x2.
#[test]
fn a_repeated_state_is_bitwise_identical_to_its_miss_through_the_tt_shim() {
    repeated_states_hit(|slots| tt_pipeline(MeshShape::ONE, slots));
    let (two, _) = tt_pipeline(MeshShape::PAIR, 4);
    let (uncached, _) = pipeline(MeshShape::ONE, 0);
    check_hit_equals_miss(&two, &uncached, &state(1500, 5), 1);
}

fn repeated_states_hit<B: MeshOps>(make: impl Fn(usize) -> (Pipeline<B>, Arc<PrefixCacheStats>)) {
    let (uncached, _) = make(0);
    for (words, seed) in [(150, 0), (1000, 1), (4000, 2)] {
        let (p, stats) = make(4);
        let s = state(words, seed);
        check_hit_equals_miss(&p, &uncached, &s, 0);
        assert_eq!(stats.hits.load(Ordering::Relaxed), 1);
        assert_eq!(stats.misses.load(Ordering::Relaxed), 1);
        // The slot holds exactly what the configuration says it would.
        let lengths = p.cached_lengths();
        assert_eq!(lengths.len(), 1);
        assert_eq!(lengths[0] % 128, 0);
        assert_eq!(
            stats.bytes.load(Ordering::Relaxed) as usize,
            p.prefix_slot_bytes(lengths[0])
        );
    }
}

#[test]
fn other_question_sets_share_the_slot_and_match_their_own_miss() {
    let (p, _) = pipeline(MeshShape::ONE, 4);
    let s = state(900, 3);
    assert_eq!(decide(&p, &s, 0, false).cache, CacheUse::Miss);
    let hit = decide(&p, &s, 1, false);
    assert_eq!(hit.cache, CacheUse::Hit);
    let (fresh, _) = pipeline(MeshShape::ONE, 4);
    let miss = decide(&fresh, &s, 1, false);
    assert_eq!(miss.cache, CacheUse::Miss);
    assert_eq!(bits(&hit), bits(&miss));
    assert_eq!(hit.response, miss.response);
}

#[test]
fn truncated_states_and_the_two_device_mesh_cache_too() {
    // Truncation: the kept state piece is what is cached.
    let (p, _) = pipeline(MeshShape::ONE, 4);
    let body = |set: usize| json!({"model": "clef", "state": state(3000, 4), "questions": questions(set), "truncate": true});
    let rule = LengthRule::Server {
        max_state: 1000,
        max_tail: 4096,
        truncate: false,
    };
    let miss = p.decide(&validate(&body(0), None).unwrap(), rule).unwrap();
    assert!(miss.record.truncated);
    assert_eq!(miss.cache, CacheUse::Miss);
    let hit = p.decide(&validate(&body(0), None).unwrap(), rule).unwrap();
    assert_eq!(hit.cache, CacheUse::Hit);
    assert_eq!(bits(&hit), bits(&miss));
    assert_eq!(p.cached_lengths(), vec![896]);

    let (two, _) = pipeline(MeshShape::PAIR, 4);
    let (uncached, _) = pipeline(MeshShape::ONE, 0);
    check_hit_equals_miss(&two, &uncached, &state(1500, 5), 1);
}

#[test]
fn short_states_are_not_cached() {
    let (p, stats) = pipeline(MeshShape::ONE, 4);
    let d = decide(&p, "a short ticket", 0, false);
    assert_eq!(d.cache, CacheUse::Uncacheable);
    assert!(p.cached_lengths().is_empty());
    assert_eq!(stats.misses.load(Ordering::Relaxed), 0);
}

#[test]
fn least_recently_used_states_are_evicted() {
    let (p, stats) = pipeline(MeshShape::ONE, 2);
    let (a, b, c) = (state(200, 10), state(330, 11), state(460, 12));
    assert_eq!(decide(&p, &a, 1, false).cache, CacheUse::Miss);
    assert_eq!(decide(&p, &b, 1, false).cache, CacheUse::Miss);
    assert_eq!(decide(&p, &a, 1, false).cache, CacheUse::Hit); // b is now the oldest
    assert_eq!(decide(&p, &c, 1, false).cache, CacheUse::Miss); // evicts b
    assert_eq!(stats.evictions.load(Ordering::Relaxed), 1);
    assert_eq!(decide(&p, &a, 1, false).cache, CacheUse::Hit);
    assert_eq!(decide(&p, &b, 1, false).cache, CacheUse::Miss); // evicts c
    assert_eq!(decide(&p, &c, 1, false).cache, CacheUse::Miss);
    assert_eq!(stats.evictions.load(Ordering::Relaxed), 3);
    let held: usize = p
        .cached_lengths()
        .iter()
        .map(|&l| p.prefix_slot_bytes(l))
        .sum();
    assert_eq!(stats.bytes.load(Ordering::Relaxed) as usize, held);
}

#[test]
fn a_cancelled_prefill_leaves_no_partial_slot() {
    let (p, stats) = pipeline(MeshShape::ONE, 4);
    let s = state(2500, 6); // prefix of two passes, then the tail
    let body = json!({"model": "clef", "state": s, "questions": questions(0)});
    let req = validate(&body, None).unwrap();
    // Cancelled inside the prefix pass (after its first chunk): nothing is kept.
    let checks = Cell::new(0);
    let cancel_second = || {
        checks.set(checks.get() + 1);
        checks.get() > 1
    };
    let err = p
        .decide_cancellable(&req, SERVER, &cancel_second)
        .unwrap_err();
    assert_eq!(err.status, 499);
    assert!(p.cached_lengths().is_empty());
    assert_eq!(stats.bytes.load(Ordering::Relaxed), 0);
    // Cancelled in the tail: the finished prefix is a whole slot, and it serves the retry with
    // the same numbers a fresh pipeline computes.
    let checks = Cell::new(0);
    let cancel_in_tail = || {
        checks.set(checks.get() + 1);
        checks.get() > 3
    };
    assert_eq!(
        p.decide_cancellable(&req, SERVER, &cancel_in_tail)
            .unwrap_err()
            .status,
        499
    );
    assert_eq!(p.cached_lengths().len(), 1);
    let retry = p.decide(&req, SERVER).unwrap();
    assert_eq!(retry.cache, CacheUse::Hit);
    let (fresh, _) = pipeline(MeshShape::ONE, 4);
    assert_eq!(bits(&retry), bits(&fresh.decide(&req, SERVER).unwrap()));
}
