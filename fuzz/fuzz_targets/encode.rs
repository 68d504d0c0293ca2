//! Rendering and encoding with the real Qwen3.5 tokenizer (the fixture's): every valid request
//! either encodes, with spans inside the prompt and the state piece within its limit, or is
//! refused with a 4xx; the Python-compatible JSON renderer emits JSON that parses (Infinity for
//! numbers beyond f64 aside, as Python writes them).
#![no_main]

use clef_tt::encode::{encode, json::dumps, EncodeError, LengthRule};
use clef_tt::request::{parse_body, validate, HostLimits};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use std::sync::OnceLock;

fn tokenizer() -> &'static tokenizers::Tokenizer {
    static TOKENIZER: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tiny-clef/tokenizer.json"
        );
        tokenizers::Tokenizer::from_file(path).expect("fixture tokenizer")
    })
}

const RULES: [LengthRule; 3] = [
    LengthRule::Server {
        max_state: 2048,
        max_tail: 1024,
        truncate: false,
    },
    LengthRule::Server {
        max_state: 256,
        max_tail: 1024,
        truncate: true,
    },
    LengthRule::Reference { max_length: 512 },
];

/// Whether a number in `v` is beyond f64 (rendered as `Infinity` / `-Infinity`).
fn has_non_finite(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.as_f64().is_none_or(|f| !f.is_finite()),
        Value::Array(a) => a.iter().any(has_non_finite),
        Value::Object(o) => o.values().any(has_non_finite),
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = parse_body(data) else { return };
    // Python's json.dumps writes Infinity for numbers beyond f64 (as the reference does);
    // everything else must come out as JSON.
    let rendered = dumps(&value, true);
    if !has_non_finite(&value) {
        assert!(
            serde_json::from_str::<Value>(&rendered).is_ok(),
            "{rendered}"
        );
    }
    let Ok(req) = validate(&value, Some(&HostLimits::default())) else {
        return;
    };
    for rule in RULES {
        match encode(tokenizer(), &req, &[], rule) {
            Ok(record) => {
                let len = record.input_ids.len();
                assert!(record.state_end <= len);
                assert_eq!(record.questions.len(), req.questions.len());
                for q in &record.questions {
                    assert!(q.span.0 < q.span.1 && q.span.1 <= len, "{q:?}");
                    for s in &q.option_spans {
                        assert!(s.0 < s.1 && s.1 <= len, "{q:?}");
                    }
                }
                match rule {
                    LengthRule::Server { max_state, .. } => assert!(record.state_end <= max_state),
                    LengthRule::Reference { max_length } => assert!(len <= max_length),
                }
            }
            Err(EncodeError::Request(e)) => assert!((400..500).contains(&e.status), "{e:?}"),
            Err(EncodeError::Tokenizer(m)) => panic!("tokenizer failed: {m}"),
        }
    }
});
