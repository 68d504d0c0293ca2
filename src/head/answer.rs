//! From logits to the reference's answers (the reference's code): an f32 softmax per
//! question, then the response shapes ([`Answer`]) with Python's `round(x, 4)`.

use crate::encode::json::round4;
use crate::encode::record::score_levels;
use crate::encode::EncodedQuestion;
use crate::request::{Answer, ChoiceAnswer, NoulAnswer, ScoreAnswer};
use crate::request::{Question, QuestionType};
use serde_json::Value;

/// Softmax over f32 logits, in f32 (the reference casts the logits to float32 first).
pub fn probabilities(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

/// One question's answer. `probs` are in model option order (`encoded.option_ids`).
pub fn answer(question: &Question, encoded: &EncodedQuestion, probs: &[f32]) -> Answer {
    answer_rounded_with(question, encoded, probs, round4)
}

/// [`answer`] with another rounding of the numbers (the identity gives the unrounded values).
pub fn answer_rounded_with(
    question: &Question,
    encoded: &EncodedQuestion,
    probs: &[f32],
    round4: impl Fn(f64) -> f64,
) -> Answer {
    let p = |id: &str| -> f64 {
        encoded
            .option_ids
            .iter()
            .position(|o| o == id)
            .map(|i| probs[i] as f64)
            .unwrap_or(0.0)
    };
    match question.kind {
        QuestionType::Noul => Answer::Noul(NoulAnswer {
            noul: round4(p("true")),
        }),
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
            Answer::Choice(ChoiceAnswer {
                choice,
                confidence: round4(top),
                probabilities: keys.iter().map(|k| ((*k).clone(), round4(p(k)))).collect(),
            })
        }
        QuestionType::Score => {
            let levels = score_levels(question);
            let ps: Vec<f64> = (0..levels.len()).map(|i| p(&i.to_string())).collect();
            let mut expected = 0.0f64;
            for (i, pi) in ps.iter().enumerate() {
                expected += i as f64 * pi;
            }
            let top = ps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            Answer::Score(ScoreAnswer {
                score: round4(expected),
                confidence: round4(top),
                legend: levels
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| (i.to_string(), v))
                    .collect(),
                probabilities: ps
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (i.to_string(), round4(*v)))
                    .collect(),
            })
        }
    }
}
