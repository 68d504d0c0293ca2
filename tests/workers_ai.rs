//! The Workers AI route (`/client/v4/accounts/{account_id}/ai/run/@cf/cloudflare/clef` and
//! without `/client/v4`) on a live server: golden requests answered in the envelope with
//! `result` equal to the `/v1/systemone` body, one test per row of the hosted error table
//! (status + code), the account and model rules, and the hosted image form
//! `{content_type, base64}` answering as the same image sent as a data URL on both routes.

mod common;

use base64::Engine as _;
use common::server::*;
use serde_json::{json, Value};
use std::sync::OnceLock;

const ROUTE: &str = "/client/v4/accounts/acc123/ai/run/@cf/cloudflare/clef";

fn shared() -> &'static str {
    static BASE: OnceLock<String> = OnceLock::new();
    BASE.get_or_init(|| start(settings(), 1, 64))
}

/// POST to `path`: status, `cf-ai-req-id`, `retry-after`, body.
fn call(base: &str, path: &str, body: &[u8], token: Option<&str>) -> (u16, Value, Option<String>) {
    let mut req = agent()
        .post(&format!("{base}{path}"))
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", &format!("Bearer {t}"));
    }
    let mut r = req.send(body).unwrap();
    let status = r.status().as_u16();
    let rid = r.headers().get("cf-ai-req-id").is_some();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = r.body_mut().read_to_string().unwrap();
    assert!(rid, "no cf-ai-req-id on {path}: {text}");
    (status, serde_json::from_str(&text).unwrap(), retry)
}

/// The refusal's status and code, checking the failure envelope.
fn refused(base: &str, path: &str, body: &[u8], token: Option<&str>) -> (u16, u64) {
    let (status, v, _) = call(base, path, body, token);
    assert_eq!(v["success"], false, "{v}");
    assert_eq!(v["result"], Value::Null);
    assert_eq!(v["messages"], json!([]));
    assert!(v["errors"][0]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    (status, v["errors"][0]["code"].as_u64().unwrap())
}

fn valid() -> Value {
    json!({"model": "clef", "state": "Checkout returns errors and orders are blocked.",
           "questions": {
               "outage": {"type": "noul", "instructions": "Is a service down?"},
               "team": {"type": "choice", "instructions": "Which team?",
                        "criteria": {"billing": "Payments", "technical": "Bugs"}},
               "urgency": {"type": "score", "instructions": "How urgent?",
                           "criteria": ["Can wait", "Today"]}}})
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

#[test]
fn golden_requests_answer_in_the_envelope_with_the_systemone_body() {
    let base = shared();
    let (mut answered, mut refused_here) = (0, 0);
    for (id, body) in golden_bodies() {
        if id == "truncation_16384" {
            continue;
        }
        let Ok(mut request) = serde_json::from_str::<Value>(&body) else {
            continue;
        };
        if let Some(o) = request.as_object_mut() {
            o.insert("model".into(), json!("clef"));
        }
        let body = bytes(&request);
        let (status, envelope, _) = call(base, ROUTE, &body, None);
        if status != 200 {
            refused_here += 1; // the hosted rules are stricter (instructions, ids, 2+ options)
            assert_eq!(envelope["success"], false);
            continue;
        }
        assert_eq!(envelope["success"], true, "{id}");
        assert_eq!(envelope["errors"], json!([]));
        let (direct_status, _, direct) = post(base, &body, &[]);
        assert_eq!(direct_status, 200, "{id}");
        assert_eq!(
            strip_latency(&envelope["result"].to_string()),
            strip_latency(&direct),
            "{id}"
        );
        answered += 1;
    }
    eprintln!(
        "{answered} goldens answered on the hosted route, {refused_here} refused by its rules"
    );
    assert!(answered >= 10, "{answered}");
    // The same without the /client/v4 prefix, and for clef-flash (its body model).
    let (status, v, _) = call(
        base,
        "/accounts/x/ai/run/@cf/cloudflare/clef",
        &bytes(&valid()),
        None,
    );
    assert_eq!((status, &v["success"]), (200, &json!(true)));
    let mut flash = valid();
    flash["model"] = json!("clef-flash");
    let (status, _, _) = call(
        base,
        "/accounts/x/ai/run/@cf/cloudflare/clef-flash",
        &bytes(&flash),
        None,
    );
    assert_eq!(status, 200);
}

#[test]
fn malformed_json_is_400_6003() {
    assert_eq!(refused(shared(), ROUTE, b"{\"model\": ", None), (400, 6003));
}

#[test]
fn no_questions_is_400_5006() {
    let mut v = valid();
    v["questions"] = json!({});
    assert_eq!(refused(shared(), ROUTE, &bytes(&v), None), (400, 5006));
}

#[test]
fn an_unknown_question_type_is_400_5006() {
    let mut v = valid();
    v["questions"]["outage"]["type"] = json!("yesno");
    assert_eq!(refused(shared(), ROUTE, &bytes(&v), None), (400, 5006));
}

#[test]
fn sixty_five_questions_is_422_5012() {
    let mut v = valid();
    v["questions"] = (0..65)
        .map(|i| {
            (
                format!("q{i}"),
                json!({"type": "noul", "instructions": "Yes?"}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    assert_eq!(refused(shared(), ROUTE, &bytes(&v), None), (422, 5012));
}

#[test]
fn a_fifth_image_is_422_5012() {
    let mut v = valid();
    v["images"] = json!(vec![data_url(); 5]);
    assert_eq!(refused(shared(), ROUTE, &bytes(&v), None), (422, 5012));
}

#[test]
fn an_unknown_field_is_422_5012_here_and_ignored_on_systemone() {
    for (field, value) in [("truncate", json!(true)), ("temperature", json!(0.5))] {
        let mut v = valid();
        v[field] = value;
        assert_eq!(
            refused(shared(), ROUTE, &bytes(&v), None),
            (422, 5012),
            "{field}"
        );
    }
    let mut v = valid();
    v["questions"]["outage"]["weight"] = json!(2);
    assert_eq!(refused(shared(), ROUTE, &bytes(&v), None), (422, 5012));
    assert_eq!(post(shared(), &bytes(&v), &[]).0, 200);
}

/// What the hosted API's published schema forbids and the reference accepts: 200 on
/// `/v1/systemone` (the reference's semantics), 422/5012 here.
#[test]
fn what_the_hosted_schema_forbids_is_422_5012_here_and_answered_on_systemone() {
    let q = |path: &str, value: Value| {
        let mut v = valid();
        let target = path.split('.').fold(&mut v, |node, key| &mut node[key]);
        *target = value;
        v
    };
    let cases = [
        // The case: option descriptions that are integers.
        (
            "integer option descriptions",
            q(
                "questions.team.criteria",
                json!({"billing": 1, "technical": 2}),
            ),
        ),
        (
            "a boolean option description",
            q("questions.team.criteria.billing", json!(true)),
        ),
        (
            "an empty option id",
            q(
                "questions.team.criteria",
                json!({"": "x", "technical": "y"}),
            ),
        ),
        (
            "number instructions",
            q("questions.outage.instructions", json!(7)),
        ),
        (
            "boolean instructions",
            q("questions.outage.instructions", json!(true)),
        ),
        ("a number state", q("state", json!(42))),
        ("a null state", q("state", json!(null))),
        (
            "a null score level",
            q("questions.urgency.criteria", json!(["Can wait", null])),
        ),
        (
            "a number score level",
            q("questions.urgency.criteria", json!(["Can wait", 2])),
        ),
        (
            "score levels as an object",
            q(
                "questions.urgency.criteria",
                json!({"low": "a", "high": "b"}),
            ),
        ),
        (
            "score levels as a string",
            q("questions.urgency.criteria", json!("ab")),
        ),
        (
            "null noul criteria",
            q("questions.outage.criteria", json!(null)),
        ),
        (
            "a number noul description",
            q("questions.outage.criteria", json!({"true": 1})),
        ),
        ("null images", q("images", json!(null))),
        ("a bare base64 image", q("images", json!([png_base64()]))),
        (
            "a model padded with U+0085 (not \\s in JavaScript)",
            q("model", json!("clef\u{85}")),
        ),
    ];
    for (what, body) in &cases {
        assert_eq!(
            refused(shared(), ROUTE, &bytes(body), None),
            (422, 5012),
            "{what}"
        );
        let mut direct = body.clone();
        direct["model"] = json!("clef");
        let (status, _, text) = post(shared(), &bytes(&direct), &[]);
        assert_eq!(status, 200, "{what} on /v1/systemone: {text}");
    }
    // What the schema allows: structured instructions, descriptions and levels, null option
    // descriptions, a model padded with JavaScript's spaces, data URLs in any case.
    let allowed = [
        q(
            "questions.outage.instructions",
            json!({"question": "Is a service down?", "data": [1]}),
        ),
        q(
            "questions.team.criteria",
            json!({"billing": {"about": "Payments"}, "technical": null}),
        ),
        q(
            "questions.urgency.criteria",
            json!([["Can", "wait"], {"level": "Today"}]),
        ),
        q(
            "questions.outage.criteria",
            json!({"true": ["down"], "false": null}),
        ),
        q(
            "state",
            json!([{"from": "a", "text": "orders are blocked"}]),
        ),
        q("model", json!("\u{3000} clef\n")),
        q("images", json!([data_url().replacen("data:", "DATA:", 1)])),
    ];
    for body in &allowed {
        let (status, envelope, _) = call(shared(), ROUTE, &bytes(body), None);
        assert_eq!(
            (status, &envelope["success"]),
            (200, &json!(true)),
            "{body}"
        );
    }
}

#[test]
fn empty_instructions_are_422_5012() {
    let mut v = valid();
    v["questions"]["outage"]["instructions"] = json!("");
    assert_eq!(refused(shared(), ROUTE, &bytes(&v), None), (422, 5012));
}

#[test]
fn a_body_model_other_than_the_paths_is_422_5012() {
    let mut v = valid();
    v["model"] = json!("clef-flash");
    assert_eq!(refused(shared(), ROUTE, &bytes(&v), None), (422, 5012));
}

#[test]
fn the_token_limit_is_413_5021() {
    let mut v = valid();
    v["state"] = json!("many words of state ".repeat(5000));
    assert_eq!(refused(shared(), ROUTE, &bytes(&v), None), (413, 5021));
}

#[test]
fn the_body_limit_is_413_5021() {
    let mut s = settings();
    s.max_body_bytes = 2000;
    let base = start(s, 1, 8);
    let mut v = valid();
    v["state"] = json!("x".repeat(3000));
    assert_eq!(refused(&base, ROUTE, &bytes(&v), None), (413, 5021));
}

#[test]
fn an_unknown_model_is_400_7000() {
    let path = "/client/v4/accounts/acc123/ai/run/@cf/meta/llama-3-8b-instruct";
    assert_eq!(refused(shared(), path, &bytes(&valid()), None), (400, 7000));
    // A model the server does not serve (CLEF_MODEL_NAMES=clef) is unknown too.
    let mut s = settings();
    s.model_names = vec!["clef".into()];
    let base = start(s, 1, 8);
    let flash = "/client/v4/accounts/a/ai/run/@cf/cloudflare/clef-flash";
    let mut v = valid();
    v["model"] = json!("clef-flash");
    assert_eq!(refused(&base, flash, &bytes(&v), None), (400, 7000));
}

#[test]
fn a_missing_or_wrong_token_is_401_10000() {
    let mut s = settings();
    s.api_key = Some("s3cret".into());
    let base = start(s, 1, 8);
    let body = bytes(&valid());
    assert_eq!(refused(&base, ROUTE, &body, None), (401, 10000));
    assert_eq!(refused(&base, ROUTE, &body, Some("wrong")), (401, 10000));
    assert_eq!(call(&base, ROUTE, &body, Some("s3cret")).0, 200);
}

#[test]
fn another_account_is_404_7003_when_clef_account_id_is_set() {
    let mut s = settings();
    s.account_id = Some("acc123".into());
    let base = start(s, 1, 8);
    let body = bytes(&valid());
    assert_eq!(call(&base, ROUTE, &body, None).0, 200);
    let other = "/client/v4/accounts/other/ai/run/@cf/cloudflare/clef";
    assert_eq!(refused(&base, other, &body, None), (404, 7003));
}

#[test]
fn a_full_queue_is_429_3040_with_retry_after() {
    let tight = start(settings(), 1, 1);
    let mut v = valid();
    v["state"] = json!("busy text ".repeat(1500));
    let body = bytes(&v);
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (base, body) = (tight.clone(), body.clone());
            std::thread::spawn(move || call(&base, ROUTE, &body, None))
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let busy: Vec<_> = results.iter().filter(|r| r.0 == 429).collect();
    assert!(
        !busy.is_empty(),
        "no 429 from a queue of one under 8 clients"
    );
    for (status, envelope, retry) in &results {
        match status {
            200 => assert_eq!(envelope["success"], true),
            429 => {
                assert_eq!(envelope["errors"][0]["code"], 3040);
                assert_eq!(retry.as_deref(), Some("1"));
            }
            other => panic!("status {other}"),
        }
    }
}

// ---- The hosted image form ---------------------------------------------------------------

fn png_base64() -> String {
    let img = image::RgbImage::from_fn(64, 48, |x, y| {
        image::Rgb([(x * 4) as u8, (y * 5) as u8, 90])
    });
    let mut png = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    base64::engine::general_purpose::STANDARD.encode(png)
}

fn data_url() -> String {
    format!("data:image/png;base64,{}", png_base64())
}

#[test]
fn an_image_as_content_type_and_base64_answers_as_its_data_url_on_both_routes() {
    let base = shared();
    let object = json!({"content_type": "image/png", "base64": png_base64()});
    let answer = |path: Option<&str>, image: Value| {
        let mut v = valid();
        v["images"] = json!([image]);
        match path {
            Some(p) => {
                let (status, envelope, _) = call(base, p, &bytes(&v), None);
                assert_eq!(status, 200, "{envelope}");
                strip_latency(&envelope["result"].to_string())
            }
            None => {
                let (status, _, text) = post(base, &bytes(&v), &[]);
                assert_eq!(status, 200, "{text}");
                strip_latency(&text)
            }
        }
    };
    let via_url = answer(None, json!(data_url()));
    assert_eq!(answer(None, object.clone()), via_url);
    assert_eq!(answer(Some(ROUTE), object), via_url);
    assert_eq!(answer(Some(ROUTE), json!(data_url())), via_url);
    // Broken objects: a 422 naming the index, on both routes.
    for bad in [
        json!({"content_type": "image/gif", "base64": png_base64()}),
        json!({"content_type": "image/png"}),
        json!({"content_type": "image/png", "base64": png_base64(), "url": "x"}),
    ] {
        let mut v = valid();
        v["images"] = json!([data_url(), bad]);
        let (status, _, text) = post(base, &bytes(&v), &[]);
        assert_eq!(status, 422, "{text}");
        let err: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            err["detail"][0]["loc"],
            json!(["body", "images", 1]),
            "{text}"
        );
        assert_eq!(refused(base, ROUTE, &bytes(&v), None), (422, 5012));
    }
}

#[test]
fn the_model_card_and_the_document_describe_the_route() {
    let base = shared();
    let (_, text) = get(base, "/openapi.json");
    let doc: Value = serde_json::from_str(&text).unwrap();
    for path in [
        "/client/v4/accounts/{account_id}/ai/run/@cf/cloudflare/clef",
        "/accounts/{account_id}/ai/run/@cf/cloudflare/clef-flash",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path}");
    }
    let hosted_request = &doc["components"]["schemas"]["WorkersAiSystemOneRequest"];
    assert_eq!(hosted_request["additionalProperties"], false);
    assert!(hosted_request["properties"].get("truncate").is_none());
    assert!(doc["components"]["schemas"]
        .get("WorkersAiEnvelope")
        .is_some());
}
