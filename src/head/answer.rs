//! From logits to the reference's answers (spec/clef-reference.md §3.3): an f32 softmax per
//! question, then the response shapes with Python's `round(x, 4)`.

use crate::api::{Question, QuestionType};
use crate::encode::json::round4;
use crate::encode::record::score_levels;
use crate::encode::EncodedQuestion;
use serde_json::{Map, Number, Value};

/// Softmax over f32 logits, in f32 (the reference casts the logits to float32 first).
pub fn probabilities(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

fn num(x: f64) -> Value {
    Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

/// One question's answer. `probs` are in model option order (`encoded.option_ids`).
pub fn answer(question: &Question, encoded: &EncodedQuestion, probs: &[f32]) -> Value {
    answer_rounded_with(question, encoded, probs, round4)
}

/// [`answer`] with another rounding of the numbers (the identity gives the unrounded values).
pub fn answer_rounded_with(
    question: &Question,
    encoded: &EncodedQuestion,
    probs: &[f32],
    round4: impl Fn(f64) -> f64,
) -> Value {
    let p = |id: &str| -> f64 {
        encoded
            .option_ids
            .iter()
            .position(|o| o == id)
            .map(|i| probs[i] as f64)
            .unwrap_or(0.0)
    };
    let mut out = Map::new();
    out.insert("type".into(), Value::from(question.kind.name()));
    match question.kind {
        QuestionType::Noul => {
            out.insert("noul".into(), num(round4(p("true"))));
        }
        QuestionType::Choice => {
            let keys: Vec<&String> = match &question.criteria {
                Some(Value::Object(c)) => c.keys().collect(),
                _ => Vec::new(),
            };
            // First maximum in the caller's order wins.
            let mut best: Option<(&String, f64)> = None;
            for k in &keys {
                let v = p(k);
                if best.is_none_or(|(_, b)| v > b) {
                    best = Some((k, v));
                }
            }
            let (choice, top) = best.map(|(k, v)| (k.clone(), v)).unwrap_or_default();
            out.insert("choice".into(), Value::from(choice));
            out.insert("confidence".into(), num(round4(top)));
            let probs: Map<String, Value> = keys
                .iter()
                .map(|k| ((*k).clone(), num(round4(p(k)))))
                .collect();
            out.insert("probabilities".into(), Value::Object(probs));
        }
        QuestionType::Score => {
            let levels = score_levels(question);
            let ps: Vec<f64> = (0..levels.len()).map(|i| p(&i.to_string())).collect();
            let mut expected = 0.0f64;
            for (i, pi) in ps.iter().enumerate() {
                expected += i as f64 * pi;
            }
            let top = ps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out.insert("score".into(), num(round4(expected)));
            out.insert("confidence".into(), num(round4(top)));
            let legend: Map<String, Value> = levels
                .into_iter()
                .enumerate()
                .map(|(i, v)| (i.to_string(), v))
                .collect();
            out.insert("legend".into(), Value::Object(legend));
            let probs: Map<String, Value> = ps
                .iter()
                .enumerate()
                .map(|(i, v)| (i.to_string(), num(round4(*v))))
                .collect();
            out.insert("probabilities".into(), Value::Object(probs));
        }
    }
    Value::Object(out)
}
