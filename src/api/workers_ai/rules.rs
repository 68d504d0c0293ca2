//! The hosted rules: what Workers AI's published schema forbids (contract's `WorkersAiBody`,
//! the `WorkersAi*` schemas of `/openapi.json`) and the reference's validation lets through,
//! each refused with 422/5012. Checked after the reference's own checks (whose refusals are
//! 400/5006 on this route) and before the counts (`hosted_limits`, also 5012): no field the
//! hosted API does not know; the body `model` the path's; the state a string, object or
//! array; instructions a non-empty string, object or array; option and noul descriptions a
//! string, object, array or null, option ids non-empty, noul criteria an object of `true` and
//! `false`; score criteria a list of strings, objects or arrays; images a list of at most 4
//! `data:` URLs or `{content_type, base64}` objects.

use super::{code, refuse, Refusal};
use crate::api::contract::is_space;
use crate::request::{HostLimits, IMAGE_CONTENT_TYPES};
use serde_json::Value;

/// Top-level fields the hosted API knows, and a question's.
const BODY_FIELDS: [&str; 4] = ["model", "state", "questions", "images"];
const QUESTION_FIELDS: [&str; 3] = ["type", "instructions", "criteria"];

/// The hosted API's image count.
pub const MAX_IMAGES: usize = 4;

/// The server's limits, no looser than the hosted API's.
pub fn hosted_limits(limits: &HostLimits) -> HostLimits {
    HostLimits {
        max_questions: limits.max_questions.min(64),
        max_choice_options: limits.max_choice_options.min(255),
        max_score_levels: limits.max_score_levels.min(10),
        max_id_chars: limits.max_id_chars.min(100),
        strict: true,
    }
}

fn rule(message: String) -> Refusal {
    refuse(422, code::HOSTED_RULE, message)
}

/// A JSON type name for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A string, object or array (`null` too when `or_null`).
fn structured(v: &Value, or_null: bool) -> bool {
    matches!(v, Value::String(_) | Value::Object(_) | Value::Array(_)) || (or_null && v.is_null())
}

/// Check a body the reference's validation accepted against the hosted schema; `selector` is
/// the path's body model (`clef`, `clef-flash`), `max_images` the images this route takes.
pub(super) fn check(body: &Value, selector: &str, max_images: usize) -> Result<(), Refusal> {
    let Value::Object(top) = body else {
        return Ok(()); // the reference's validation refuses it first
    };
    let unknown = |field: String| {
        rule(format!(
            "{field}: an unknown field (the hosted API accepts only the documented fields)"
        ))
    };
    if let Some(k) = top.keys().find(|k| !BODY_FIELDS.contains(&k.as_str())) {
        return Err(unknown(k.clone()));
    }
    let model = top.get("model").and_then(Value::as_str).unwrap_or_default();
    if model.trim_matches(is_space) != selector {
        let path_model = format!("@cf/cloudflare/{selector}");
        return Err(rule(format!(
            "model: {model:?} does not match the path's {path_model} (send \"{selector}\")"
        )));
    }
    if let Some(state) = top.get("state").filter(|s| !structured(s, false)) {
        return Err(rule(format!(
            "state: {} (the hosted API takes a string, an object or an array)",
            kind(state)
        )));
    }
    for (id, q) in top
        .get("questions")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        check_question(id, q)?;
    }
    check_images(top.get("images"), max_images)
}

fn check_question(id: &str, q: &Value) -> Result<(), Refusal> {
    let Value::Object(q) = q else {
        return Ok(()); // the reference's validation refuses it first
    };
    if let Some(k) = q.keys().find(|k| !QUESTION_FIELDS.contains(&k.as_str())) {
        return Err(rule(format!(
            "questions.{id}.{k}: an unknown field (the hosted API accepts only the documented fields)"
        )));
    }
    let filled = match q.get("instructions") {
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        _ => false,
    };
    if !filled {
        let given = q.get("instructions").map_or("missing", |v| match v {
            Value::String(_) | Value::Object(_) | Value::Array(_) => "empty",
            other => kind(other),
        });
        return Err(rule(format!(
            "questions.{id}.instructions: {given}; required: a non-empty string, object or array"
        )));
    }
    let at = |what: &str| format!("questions.{id}.criteria{what}");
    match (q.get("type").and_then(Value::as_str), q.get("criteria")) {
        (Some("noul"), Some(c)) => {
            let Value::Object(c) = c else {
                return Err(rule(format!(
                    "{}: {}; noul criteria are an object of \"true\" and \"false\"",
                    at(""),
                    kind(c)
                )));
            };
            for (k, v) in c {
                if k != "true" && k != "false" {
                    return Err(rule(format!(
                        "{}: an unknown field (the hosted API accepts only the documented fields)",
                        at(&format!(".{k}"))
                    )));
                }
                if !structured(v, true) {
                    return Err(rule(format!(
                        "{}: {}; a description is a string, an object, an array or null",
                        at(&format!(".{k}")),
                        kind(v)
                    )));
                }
            }
        }
        (Some("choice"), Some(Value::Object(c))) => {
            for (k, v) in c {
                if k.is_empty() {
                    return Err(rule(format!("{}: an empty option id", at(""))));
                }
                if !structured(v, true) {
                    return Err(rule(format!(
                        "{}: {}; a description is a string, an object, an array or null",
                        at(&format!(".{k}")),
                        kind(v)
                    )));
                }
            }
        }
        (Some("score"), Some(c)) => {
            let Value::Array(levels) = c else {
                return Err(rule(format!(
                    "{}: {}; score criteria are a list of levels",
                    at(""),
                    kind(c)
                )));
            };
            if let Some((i, v)) = levels
                .iter()
                .enumerate()
                .find(|(_, v)| !structured(v, false))
            {
                return Err(rule(format!(
                    "{}: {}; a level is a string, an object or an array",
                    at(&format!(".{i}")),
                    kind(v)
                )));
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_images(images: Option<&Value>, max_images: usize) -> Result<(), Refusal> {
    let images = match images {
        None => return Ok(()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(rule(format!(
                "images: {}; images are a list of data: URLs or {{content_type, base64}}",
                kind(other)
            )))
        }
    };
    if images.len() > max_images {
        return Err(rule(format!(
            "images: {} images; at most {max_images} are allowed",
            images.len()
        )));
    }
    for (i, image) in images.iter().enumerate() {
        let ok = match image {
            Value::String(s) => s
                .get(..5)
                .is_some_and(|scheme| scheme.eq_ignore_ascii_case("data:")),
            Value::Object(o) => {
                o.len() == 2
                    && o.get("content_type")
                        .and_then(Value::as_str)
                        .is_some_and(|t| IMAGE_CONTENT_TYPES.contains(&t))
                    && o.get("base64").is_some_and(Value::is_string)
            }
            _ => false,
        };
        if !ok {
            return Err(rule(format!(
                "images.{i}: an image is a base64 data: URL (data:image/png;base64,...) or \
                 {{\"content_type\": \"image/png|image/jpeg|image/webp\", \"base64\": \"...\"}}; \
                 remote URLs and bare base64 are not accepted"
            )));
        }
    }
    Ok(())
}

/// Images as the decoder reads them: the `data:` scheme of a hosted image string in lower
/// case (the hosted pattern takes it in any case, URL schemes being case-insensitive; the
/// reference, and `/v1/systemone`, strip only a lower-case `data:`).
pub(super) fn lower_data_schemes(body: &mut Value) {
    let Some(Value::Array(images)) = body.get_mut("images") else {
        return;
    };
    for image in images {
        if let Value::String(s) = image {
            if s.get(..5)
                .is_some_and(|p| p != "data:" && p.eq_ignore_ascii_case("data:"))
            {
                s.replace_range(..5, "data:");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check;
    use serde_json::{json, Value};

    fn body(question: Value) -> Value {
        json!({"model": "clef", "state": "s", "questions": {"q": question}})
    }

    fn refused(v: &Value) -> bool {
        check(v, "clef", 4).is_err()
    }

    #[test]
    fn the_schema_types_are_enforced() {
        let ok = |q: Value| assert!(!refused(&body(q.clone())), "{q}");
        let no = |q: Value| assert!(refused(&body(q.clone())), "{q}");
        ok(json!({"type": "noul", "instructions": "?"}));
        ok(
            json!({"type": "noul", "instructions": {"q": "?"}, "criteria": {"true": null, "false": ["x"]}}),
        );
        no(json!({"type": "noul", "instructions": 5}));
        no(json!({"type": "noul", "instructions": []}));
        no(json!({"type": "noul"}));
        no(json!({"type": "noul", "instructions": "?", "criteria": null}));
        no(json!({"type": "noul", "instructions": "?", "criteria": {"true": 1}}));
        no(json!({"type": "noul", "instructions": "?", "criteria": {"maybe": "x"}}));
        ok(json!({"type": "choice", "instructions": "?", "criteria": {"a": "x", "b": null}}));
        no(json!({"type": "choice", "instructions": "?", "criteria": {"a": 1, "b": 2}}));
        no(json!({"type": "choice", "instructions": "?", "criteria": {"a": "x", "": "y"}}));
        ok(json!({"type": "score", "instructions": "?", "criteria": ["a", {"b": 1}, [2]]}));
        no(json!({"type": "score", "instructions": "?", "criteria": ["a", null]}));
        no(json!({"type": "score", "instructions": "?", "criteria": {"a": "x", "b": "y"}}));
        no(json!({"type": "score", "instructions": "?", "criteria": "abc"}));
        no(json!({"type": "noul", "instructions": "?", "extra": 1}));
    }

    #[test]
    fn a_data_scheme_in_any_case_is_read_as_lower_case() {
        let mut b = json!({"images": ["DaTa:image/png;base64,AA", "data:x", "iVBOR", {"a": 1}]});
        super::lower_data_schemes(&mut b);
        assert_eq!(
            b["images"],
            json!(["data:image/png;base64,AA", "data:x", "iVBOR", {"a": 1}])
        );
    }

    #[test]
    fn state_model_and_images() {
        let with = |k: &str, v: Value| {
            let mut b = body(json!({"type": "noul", "instructions": "?"}));
            b[k] = v;
            b
        };
        assert!(!refused(&with("state", json!([1]))));
        assert!(!refused(&with("state", json!({"a": 1}))));
        for state in [json!(5), json!(true), json!(null)] {
            assert!(refused(&with("state", state)));
        }
        assert!(!refused(&with("model", json!(" \u{3000}clef\n"))));
        assert!(refused(&with("model", json!("clef-flash"))));
        assert!(
            refused(&with("model", json!("clef\u{85}"))),
            "NEL is no \\s in JS"
        );
        assert!(!refused(&with(
            "images",
            json!(["DATA:image/png;base64,x"])
        )));
        assert!(!refused(&with(
            "images",
            json!([{"content_type": "image/webp", "base64": "x"}])
        )));
        for images in [
            json!(null),
            json!(["iVBORw0KGgo="]),
            json!(["https://example.com/a.png"]),
            json!([{"content_type": "image/gif", "base64": "x"}]),
            json!([{"content_type": "image/png", "base64": "x", "name": "a"}]),
            json!(["data:a", "data:b", "data:c", "data:d", "data:e"]),
        ] {
            assert!(refused(&with("images", images.clone())), "{images}");
        }
        assert!(refused(&with("truncate", json!(true))));
    }
}
