//! The renderer and the request checks: Python's float repr and `round(x, 4)` against a table
//! CPython printed (`tests/data/python_float_repr.json`), render round-trips through a JSON
//! parser for arbitrary values, and every malformed shape gets a 422 naming the field.

mod common;

use clef_tt::encode::json::{dumps, float_repr, round4};
use clef_tt::encode::{encode, render, EncodeError, LengthRule};
use clef_tt::request::{parse_body, validate, HostLimits};
use proptest::prelude::*;
use serde_json::Value;

fn python_table(key: &str) -> Vec<(f64, String)> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/python_float_repr.json"
    ))
    .unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    json[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let hex = row[0].as_str().unwrap();
            let bytes: Vec<u8> = (0..8)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            (
                f64::from_le_bytes(bytes.try_into().unwrap()),
                row[1].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn float_repr_equals_cpython_on_the_table() {
    let rows = python_table("rows");
    assert!(rows.len() > 600);
    for (v, want) in rows {
        assert_eq!(float_repr(v), want, "{v:e}");
    }
}

#[test]
fn round4_equals_cpython_round_on_the_table() {
    for (v, want) in python_table("round4") {
        assert_eq!(float_repr(round4(v)), want, "round({v:e}, 4)");
    }
}

#[test]
fn render_follows_python_json_dumps() {
    let v: Value = serde_json::from_str(
        r#"{"b":1e2,"a":[-0,-0.0,1E+16,2.5e-7,12345678901234567890123,"é\u0007\n\"\\/\u2028"],"A":null,"á":true}"#,
    )
    .unwrap();
    assert_eq!(
        render(&v),
        "{\"A\":null,\"a\":[0,-0.0,1e+16,2.5e-07,12345678901234567890123,\"é\\u0007\\n\\\"\\\\/\u{2028}\"],\"b\":100.0,\"á\":true}"
    );
    assert_eq!(
        render(&Value::from("plain <|im_end|> text")),
        "plain <|im_end|> text"
    );
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "-?[1-9][0-9]{0,30}".prop_map(|s| serde_json::from_str(&s).unwrap()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| serde_json::from_str(&format!("{f:e}")).unwrap()),
        "\\PC{0,12}".prop_map(Value::from),
        "[\\u{0}-\\u{1f}\"\\\\a-z\\u{7f}-\\u{3000}]{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(("\\PC{0,6}", inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Equal as a JSON parser sees them: numbers by value, objects as maps.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (sx, sy) = (x.to_string(), y.to_string());
            if sx.contains(['.', 'e', 'E']) || sy.contains(['.', 'e', 'E']) {
                x.as_f64() == y.as_f64()
            } else {
                // Exact integers; -0 is 0.
                let canon = |s: &str| {
                    if s == "-0" {
                        "0".to_string()
                    } else {
                        s.to_string()
                    }
                };
                canon(&sx) == canon(&sy)
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}

proptest! {
    #[test]
    fn rendered_json_parses_back_to_the_same_value(v in json_value()) {
        let text = dumps(&v, true);
        let back: Value = serde_json::from_str(&text).unwrap();
        prop_assert!(same_value(&v, &back), "{} -> {}", v, text);
        // Keys come out sorted at every level.
        fn sorted(v: &Value) -> bool {
            match v {
                Value::Object(m) => m.keys().zip(m.keys().skip(1)).all(|(a, b)| a < b) && m.values().all(sorted),
                Value::Array(a) => a.iter().all(sorted),
                _ => true,
            }
        }
        prop_assert!(sorted(&back));
    }
}

fn invalid(body: &str) -> clef_tt::request::RequestError {
    let parsed = match parse_body(body.as_bytes()) {
        Ok(p) => p,
        Err(e) => return e,
    };
    match validate(&parsed, Some(&HostLimits::default())) {
        Ok(r) => panic!("accepted: {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn shapes_the_reference_crashes_on_are_422_naming_the_field() {
    let e = invalid(r#"{"model":"m","state":"s","questions":{"q":"not an object"}}"#);
    assert_eq!(
        (e.status, e.msg.as_str()),
        (422, "q: question must be an object")
    );
    let e = invalid(
        r#"{"model":"m","state":"s","questions":{"q":{"type":"choice","criteria":["a","b"]}}}"#,
    );
    assert!(
        e.msg.starts_with("q: choice criteria must be an object"),
        "{}",
        e.msg
    );
    assert_eq!(
        e.loc,
        vec![
            Value::from("body"),
            "questions".into(),
            "q".into(),
            "criteria".into()
        ]
    );
    let e = invalid(r#"{"model":"m","state":"s","questions":{"q":{"type":["noul"]}}}"#);
    assert_eq!(e.msg, "q: type must be noul, choice, or score");
    let e = invalid(
        r#"{"model":"m","state":"s","questions":{"q":{"type":"noul","criteria":["yes"]}}}"#,
    );
    assert!(
        e.msg.contains("noul criteria must be an object"),
        "{}",
        e.msg
    );
    let e = invalid(r#"{"model":"m","state":"s","questions":{"q":{"type":"score","criteria":7}}}"#);
    assert!(e.msg.contains("score criteria must be a list"), "{}", e.msg);
    let e =
        invalid(r#"{"model":"m","state":"s","questions":{"q":{"type":"noul"}},"truncate":"yes"}"#);
    assert_eq!(e.loc.last().unwrap(), "truncate");
    let e = invalid("{\"model\": \"m\", \"state\": \"\\ud800\"}");
    assert_eq!((e.status, e.kind.as_str()), (422, "json_invalid"));
    let e = invalid("\u{feff}not json");
    assert_eq!(e.kind, "json_invalid");
}

#[test]
fn deep_nesting_and_huge_numbers_are_handled() {
    let deep = format!(
        r#"{{"model":"m","state":{}1{},"questions":{{"q":{{"type":"noul"}}}}}}"#,
        "[".repeat(500),
        "]".repeat(500)
    );
    let e = invalid(&deep);
    assert_eq!((e.status, e.kind.as_str()), (422, "json_invalid"));
    // A 400-digit integer and an overflowing float are kept as the reference sees them.
    let big = format!(
        r#"{{"model":"m","state":{{"n":{},"f":1e400}},"questions":{{"q":{{"type":"noul"}}}}}}"#,
        "9".repeat(400)
    );
    let r = validate(&parse_body(big.as_bytes()).unwrap(), None).unwrap();
    assert_eq!(
        render(&r.state),
        format!(r#"{{"f":Infinity,"n":{}}}"#, "9".repeat(400))
    );
}

#[test]
fn strict_mode_adds_the_hosted_rules() {
    let strict = HostLimits {
        strict: true,
        ..HostLimits::default()
    };
    let check = |body: &str| validate(&parse_body(body.as_bytes()).unwrap(), Some(&strict));
    assert!(check(
        r#"{"model":"m","state":"s","questions":{"q":{"type":"noul","instructions":"Is it?"}}}"#
    )
    .is_ok());
    let e = check(r#"{"model":"m","state":"s","questions":{"q":{"type":"noul"}}}"#).unwrap_err();
    assert!(e.msg.contains("instructions are required"), "{}", e.msg);
    let e = check(
        r#"{"model":"m","state":"s","questions":{"bad id!":{"type":"noul","instructions":"x"}}}"#,
    )
    .unwrap_err();
    assert!(e.msg.contains("[A-Za-z0-9_.-]{1,100}"), "{}", e.msg);
    let e = check(r#"{"model":"m","state":"s","questions":{"c":{"type":"choice","instructions":"x","criteria":{"only":null}}}}"#).unwrap_err();
    assert!(e.msg.contains("at least 2 options"), "{}", e.msg);
    // Without --strict the reference's leniency stands.
    assert!(validate(&parse_body(br#"{"model":"m","state":"s","questions":{"c":{"type":"choice","criteria":{"only":null}}}}"#).unwrap(), Some(&HostLimits::default())).is_ok());
}

#[test]
fn host_bounds_are_422_naming_the_count() {
    let huge: String = (0..10_000)
        .map(|i| format!("\"q{i}\":{{\"type\":\"noul\"}}"))
        .collect::<Vec<_>>()
        .join(",");
    let e = invalid(&format!(
        r#"{{"model":"m","state":"s","questions":{{{huge}}}}}"#
    ));
    assert!(e.msg.contains("10000 questions; at most 64"), "{}", e.msg);
    let long_id = "x".repeat(1 << 20);
    let e = invalid(&format!(
        r#"{{"model":"m","state":"s","questions":{{"{long_id}":{{"type":"noul"}}}}}}"#
    ));
    assert!(
        e.msg.contains("1048576 characters; at most 1024"),
        "{}",
        e.msg
    );
    let many: String = (0..65)
        .map(|i| format!("\"q{i}\":{{\"type\":\"noul\"}}"))
        .collect::<Vec<_>>()
        .join(",");
    let e = invalid(&format!(
        r#"{{"model":"m","state":"s","questions":{{{many}}}}}"#
    ));
    assert!(e.msg.contains("65 questions; at most 64"), "{}", e.msg);
    let opts: String = (0..256)
        .map(|i| format!("\"o{i}\":null"))
        .collect::<Vec<_>>()
        .join(",");
    let e = invalid(&format!(
        r#"{{"model":"m","state":"s","questions":{{"c":{{"type":"choice","criteria":{{{opts}}}}}}}}}"#
    ));
    assert!(
        e.msg.contains("256 choice options; at most 255"),
        "{}",
        e.msg
    );
    let e = invalid(
        r#"{"model":"m","state":"s","questions":{"s":{"type":"score","criteria":[1,2,3,4,5,6,7,8,9,10,11]}}}"#,
    );
    assert!(e.msg.contains("11 score levels; at most 10"), "{}", e.msg);
}

fn tokenizer() -> tokenizers::Tokenizer {
    clef_tt::checkpoint::Checkpoint::open(&common::fixtures().join("tiny-clef"))
        .unwrap()
        .tokenizer()
        .unwrap()
}

fn encode_body(
    body: &str,
    rule: LengthRule,
) -> Result<clef_tt::encode::EncodedRecord, EncodeError> {
    let r = validate(&parse_body(body.as_bytes()).unwrap(), None).unwrap();
    encode(&tokenizer(), &r, &[], rule)
}

#[test]
fn an_empty_instruction_span_is_422_not_nan() {
    let e = encode_body(
        r#"{"model":"m","state":"s","questions":{"":{"type":"noul"}}}"#,
        LengthRule::Reference { max_length: 16384 },
    );
    match e {
        Err(EncodeError::Request(e)) => {
            assert!(e.msg.contains("instruction text is empty"), "{}", e.msg)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn server_lengths_refuse_or_truncate_the_state_piece() {
    let state = "word ".repeat(400);
    let body = format!(
        r#"{{"model":"m","state":"{state}","questions":{{"q":{{"type":"noul","instructions":"Is it long?"}}}}}}"#
    );
    let strict = LengthRule::Server {
        max_state: 200,
        max_tail: 4096,
        truncate: false,
    };
    match encode_body(&body, strict) {
        Err(EncodeError::Request(e)) => {
            assert_eq!(e.kind, "max_tokens_exceeded");
            assert!(e.msg.contains("at most 200"), "{}", e.msg);
        }
        other => panic!("{other:?}"),
    }
    let cut = encode_body(
        &body,
        LengthRule::Server {
            max_state: 200,
            max_tail: 4096,
            truncate: true,
        },
    )
    .unwrap();
    assert!(cut.truncated);
    assert_eq!(cut.state_end, 200);
    let whole = encode_body(
        &body,
        LengthRule::Server {
            max_state: 16384,
            max_tail: 4096,
            truncate: false,
        },
    )
    .unwrap();
    assert!(!whole.truncated);
    // The kept state tokens are the first ones, and the schema follows unchanged.
    assert_eq!(&cut.input_ids[..200], &whole.input_ids[..200]);
    assert_eq!(&cut.input_ids[200..], &whole.input_ids[whole.state_end..]);
    match encode_body(
        &body,
        LengthRule::Server {
            max_state: 16384,
            max_tail: 10,
            truncate: true,
        },
    ) {
        Err(EncodeError::Request(e)) => assert_eq!(e.kind, "max_tokens_exceeded"),
        other => panic!("{other:?}"),
    }
}
