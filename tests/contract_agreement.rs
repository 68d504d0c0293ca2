//! The request contract has two definitions: the schema `/openapi.json` publishes for
//! `POST /v1/systemone` (`api/contract/request.rs`) and the validator the server runs
//! (`request/body.rs`). This test holds them to one another mechanically: bodies generated
//! from the documented type, then mutated one way each (a field removed, retyped, emptied,
//! added, a limit passed), are accepted by the JSON Schema validator exactly when the server's
//! validator accepts them.
//!
//! The schema cannot say two things the reference checks, and the comparison leaves them out:
//! what a question is as prompt text (an option id must not be empty once rendered, which
//! depends on `json.dumps` of any JSON value), and media contents (images that are not
//! pictures are refused after decoding, a 422 the document lists).

mod common;

use clef_tt::api::openapi::document;
use clef_tt::request::{parse_body, validate, HostLimits};
use common::server::settings;
use proptest::prelude::*;
use serde_json::{json, Value};

/// The documented body schema, resolvable on its own (its `$ref`s point into `components`).
fn body_validator() -> &'static jsonschema::Validator {
    static VALIDATOR: std::sync::OnceLock<jsonschema::Validator> = std::sync::OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let doc = document(&settings());
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$ref": "#/components/schemas/SystemOneRequest",
            "components": doc["components"],
        });
        jsonschema::validator_for(&schema).expect("the document's request schema compiles")
    })
}

fn text() -> impl Strategy<Value = String> + Clone {
    "[A-Za-z0-9 _.,?!'-]{1,16}"
}

fn any_json() -> impl Strategy<Value = Value> + Clone {
    prop_oneof![
        4 => text().prop_map(Value::from),
        1 => any::<i16>().prop_map(Value::from),
        1 => any::<bool>().prop_map(Value::from),
        1 => Just(Value::Null),
        1 => proptest::collection::vec(text(), 0..3).prop_map(Value::from),
    ]
}

/// A question the reference answers.
fn question() -> impl Strategy<Value = Value> {
    prop_oneof![
        (text(), proptest::option::of(text())).prop_map(|(i, yes)| {
            let mut q = json!({"type": "noul", "instructions": i});
            if let Some(y) = yes {
                q["criteria"] = json!({"true": y});
            }
            q
        }),
        (
            text(),
            proptest::collection::vec(("[a-z]{1,8}", text()), 1..5)
        )
            .prop_map(|(i, o)| {
                let options: serde_json::Map<String, Value> =
                    o.into_iter().map(|(k, v)| (k, Value::from(v))).collect();
                json!({"type": "choice", "instructions": i, "criteria": options})
            }),
        (text(), proptest::collection::vec(text(), 1..6)).prop_map(|(i, levels)| {
            json!({"type": "score", "instructions": i, "criteria": levels})
        }),
    ]
}

fn body() -> impl Strategy<Value = Value> {
    (
        text(),
        any_json(),
        proptest::collection::vec(("[a-z][a-z0-9_]{0,8}", question()), 1..4),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(|(model, state, questions, truncate)| {
            let mut b = json!({
                "model": model,
                "state": state,
                "questions": questions.into_iter().collect::<serde_json::Map<String, Value>>(),
            });
            if let Some(t) = truncate {
                b["truncate"] = Value::from(t);
            }
            b
        })
}

/// One way to change a body (applied to its first question where it names one).
#[derive(Clone, Debug)]
enum Mutation {
    None,
    Remove(&'static str),
    Set(&'static str, Value),
    QuestionRemove(&'static str),
    QuestionSet(&'static str, Value),
    NoQuestions,
    ManyQuestions(usize),
    QuestionsAs(Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let odd = prop_oneof![
        Just(Value::Null),
        Just(json!(3)),
        Just(json!(true)),
        Just(json!("")),
        Just(json!("x")),
        Just(json!([])),
        Just(json!([1, 2])),
        Just(json!({})),
        Just(json!({"a": 1})),
    ];
    prop_oneof![
        2 => Just(Mutation::None),
        1 => prop_oneof![Just("model"), Just("state"), Just("questions")].prop_map(Mutation::Remove),
        2 => (prop_oneof![Just("model"), Just("truncate"), Just("images"), Just("videos"),
               Just("extra")], odd.clone())
            .prop_map(|(k, v)| Mutation::Set(k, v)),
        1 => prop_oneof![Just("type"), Just("instructions"), Just("criteria")]
            .prop_map(Mutation::QuestionRemove),
        3 => (prop_oneof![Just("type"), Just("instructions"), Just("criteria"), Just("extra")],
              prop_oneof![odd, Just(json!("noul")), Just(json!("choice")), Just(json!("score")),
                          Just(json!("bogus")), Just(json!(["a", "b", "c"])),
                          Just(json!({"x": "y", "z": "w"}))])
            .prop_map(|(k, v)| Mutation::QuestionSet(k, v)),
        1 => Just(Mutation::NoQuestions),
        1 => (9usize..40).prop_map(Mutation::ManyQuestions),
        1 => prop_oneof![Just(json!([])), Just(json!("q")), Just(json!(null))]
            .prop_map(Mutation::QuestionsAs),
    ]
}

fn apply(mut b: Value, m: &Mutation) -> Value {
    let first = b["questions"]
        .as_object()
        .and_then(|q| q.keys().next().cloned())
        .unwrap_or_default();
    match m {
        Mutation::None => {}
        Mutation::Remove(k) => {
            b.as_object_mut().map(|o| o.remove(*k));
        }
        Mutation::Set(k, v) => b[*k] = v.clone(),
        Mutation::QuestionRemove(k) => {
            b["questions"][&first].as_object_mut().map(|o| o.remove(*k));
        }
        Mutation::QuestionSet(k, v) => b["questions"][&first][*k] = v.clone(),
        Mutation::NoQuestions => b["questions"] = json!({}),
        Mutation::ManyQuestions(n) => {
            let q = b["questions"][&first].clone();
            for i in 0..*n {
                b["questions"][format!("extra_{i}")] = q.clone();
            }
        }
        Mutation::QuestionsAs(v) => b["questions"] = v.clone(),
    }
    b
}

/// Bodies the comparison leaves out (module header): an option or level that renders as an
/// empty id.
fn outside_the_schema(b: &Value) -> bool {
    b["questions"].as_object().is_some_and(|qs| {
        qs.values().any(|q| match &q["criteria"] {
            Value::Object(o) => o.keys().any(|k| k.is_empty()),
            _ => false,
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn the_schema_and_the_validator_accept_the_same_bodies(b in body(), m in mutation()) {
        let b = apply(b, &m);
        prop_assume!(!outside_the_schema(&b));
        let schema = body_validator();
        let documented = schema.is_valid(&b);
        let bytes = serde_json::to_vec(&b).unwrap();
        let served = parse_body(&bytes)
            .and_then(|v| validate(&v, Some(&HostLimits::default())));
        prop_assert_eq!(
            documented,
            served.is_ok(),
            "{:?}: the schema says {}, the validator {:?}: {}",
            m,
            documented,
            served.err().map(|e| e.msg),
            b
        );
    }
}

/// The comparison is not vacuous: the schema refuses what the validator refuses, on bodies of
/// every kind of change above, and accepts the untouched ones.
#[test]
fn the_schema_refuses_and_accepts() {
    let schema = body_validator();
    let good = json!({"model": "m", "state": "s",
                      "questions": {"q": {"type": "noul", "instructions": "?"}}});
    assert!(schema.is_valid(&good));
    // Unknown keys are ignored by the reference (pydantic's default), and documented so.
    let extra = json!({"model": "m", "state": "s", "questions": {"q": {"type": "noul"}}, "x": 1});
    assert!(schema.is_valid(&extra));
    for bad in [
        json!({"state": "s", "questions": {"q": {"type": "noul"}}}),
        json!({"model": 3, "state": "s", "questions": {"q": {"type": "noul"}}}),
        json!({"model": "m", "state": "s", "questions": {}}),
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "bogus"}}}),
        json!({"model": "m", "state": "s", "questions": {"q": {"type": "choice", "criteria": {}}}}),
    ] {
        assert!(!schema.is_valid(&bad), "{bad}");
        let bytes = serde_json::to_vec(&bad).unwrap();
        assert!(
            parse_body(&bytes).and_then(|v| validate(&v, None)).is_err(),
            "{bad}"
        );
    }
}
