//! The OpenAPI document (`GET /openapi.json`, `clef-tt openapi`): served without the key, every
//! route and status the server has, the limits it was started with, the wire types equal to
//! the bytes the server sends, and every body of the documented request type answered. The
//! live fuzzing against the document is schemathesis's (`tests/schemathesis/run.sh`, in CI);
//! the regressions it found are kept here.

mod common;

use clef_tt::api::contract::{
    ChoiceQuestion, DecisionBody, ErrorBody, NoulQuestion, QuestionBody, ScoreQuestion,
    SystemOneBody,
};
use clef_tt::api::openapi::document;
use clef_tt::request::HostLimits;
use common::process::{assert_succeeded, clef_tt, spawn_server};
use common::server::*;
use indexmap::IndexMap;
use proptest::prelude::*;
use serde_json::Value;

fn doc_get(doc: &Value, pointer: &str) -> Value {
    doc.pointer(pointer)
        .cloned()
        .unwrap_or_else(|| panic!("the document has no {pointer}"))
}

/// `~1` escapes `/` in a JSON pointer.
fn path(p: &str) -> String {
    format!("/paths/{}", p.replace('~', "~0").replace('/', "~1"))
}

#[test]
fn the_document_is_served_without_the_key_and_every_documented_route_answers_as_documented() {
    let mut s = settings();
    s.api_key = Some("s3cret".into());
    let base = start(s, 1, 8);
    let (status, text) = get(&base, "/openapi.json");
    assert_eq!(status, 200, "{text}");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc_get(&doc, "/components/securitySchemes/bearer/scheme"),
        "bearer"
    );
    let paths = doc["paths"].as_object().unwrap();
    let listed: Vec<&str> = paths.keys().map(String::as_str).collect();
    for route in [
        "/v1/systemone",
        "/v1/models",
        "/health",
        "/v1/health",
        "/metrics",
        "/openapi.json",
        "/",
        "/demo/app.js",
        "/demo/style.css",
    ] {
        assert!(listed.contains(&route), "{route} is not documented");
    }
    // Every documented GET answers one of its documented statuses with its content type,
    // with and without the key.
    for (route, item) in paths {
        let Some(op) = item.get("get") else { continue };
        for key in [None, Some("Bearer s3cret")] {
            let mut req = agent().get(&format!("{base}{route}"));
            if let Some(k) = key {
                req = req.header("authorization", k);
            }
            let r = req.call().unwrap();
            let status = r.status().as_u16().to_string();
            let documented = op["responses"]
                .get(&status)
                .unwrap_or_else(|| panic!("GET {route} answered an undocumented {status}"));
            let mime = r
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .to_string();
            assert!(
                documented["content"].get(&mime).is_some(),
                "GET {route} {status}: {mime} is not documented"
            );
        }
    }
    // The decision route's statuses include every status the contract names.
    let decide = doc_get(&doc, &format!("{}/post/responses", path("/v1/systemone")));
    for status in [
        "200", "400", "401", "404", "413", "415", "422", "429", "500", "503",
    ] {
        assert!(decide.get(status).is_some(), "POST /v1/systemone {status}");
    }
    assert_eq!(decide["429"]["headers"]["Retry-After"]["required"], true);
    assert_eq!(
        decide["200"]["headers"]["x-clef-state-key"]["schema"]["pattern"],
        "^[0-9a-f]{64}$"
    );
    assert_eq!(
        decide["200"]["headers"]["x-clef-prefix-cache"]["schema"]["enum"],
        serde_json::json!(["off", "uncacheable", "hit", "miss"])
    );
}

#[test]
fn the_document_carries_the_limits_the_server_was_started_with() {
    let plain = document(&settings());
    let schemas = "/components/schemas";
    let q = format!("{schemas}/SystemOneRequest/properties/questions");
    assert_eq!(doc_get(&plain, &format!("{q}/maxProperties")), 64);
    assert_eq!(
        doc_get(&plain, &format!("{q}/propertyNames/maxLength")),
        1024
    );
    assert_eq!(
        doc_get(
            &plain,
            &format!("{schemas}/ChoiceQuestion/properties/criteria/maxProperties")
        ),
        255
    );
    assert_eq!(
        doc_get(
            &plain,
            &format!("{schemas}/ScoreQuestion/properties/criteria/anyOf/0/maxItems")
        ),
        10
    );
    assert_eq!(
        doc_get(
            &plain,
            &format!("{schemas}/SystemOneRequest/properties/images/maxItems")
        ),
        4
    );
    assert!(plain.pointer("/components/securitySchemes").is_none());
    assert!(plain
        .pointer(&format!("{}/post/responses/401", path("/v1/systemone")))
        .is_none());

    let mut s = settings();
    s.limits = HostLimits {
        max_questions: 7,
        max_choice_options: 5,
        max_score_levels: 4,
        max_id_chars: 300,
        strict: true,
    };
    s.model_names = vec!["clef".into(), "clef-flash".into()];
    s.media = None;
    s.demo = false;
    s.max_body_bytes = 1000;
    let strict = document(&s);
    assert_eq!(doc_get(&strict, &format!("{q}/maxProperties")), 7);
    assert_eq!(
        doc_get(&strict, &format!("{q}/propertyNames/maxLength")),
        100
    );
    assert_eq!(
        doc_get(&strict, &format!("{q}/propertyNames/pattern")),
        "^[A-Za-z0-9_.-]+$"
    );
    let choice = doc_get(&strict, &format!("{schemas}/ChoiceQuestion"));
    assert_eq!(choice["properties"]["criteria"]["minProperties"], 2);
    assert_eq!(choice["properties"]["criteria"]["maxProperties"], 5);
    assert_eq!(
        choice["required"],
        serde_json::json!(["criteria", "type", "instructions"])
    );
    assert_eq!(
        doc_get(&strict, &format!("{schemas}/NoulQuestion/required")),
        serde_json::json!(["type", "instructions"])
    );
    assert_eq!(
        doc_get(
            &strict,
            &format!("{schemas}/SystemOneRequest/properties/model/enum")
        ),
        serde_json::json!(["clef", "clef-flash"])
    );
    for media in ["images", "videos"] {
        assert_eq!(
            doc_get(
                &strict,
                &format!("{schemas}/SystemOneRequest/properties/{media}/maxItems")
            ),
            0
        );
    }
    let description = doc_get(
        &strict,
        &format!("{}/post/description", path("/v1/systemone")),
    );
    assert!(description.as_str().unwrap().contains("1000 bytes"));
    assert!(
        strict.pointer(&path("/")).is_none(),
        "demo off, page listed"
    );
}

#[test]
fn clef_tt_openapi_prints_the_document_the_server_serves_with_the_same_flags() {
    let flags = ["--strict", "1", "--model-names", "clef,clef-flash"];
    let out = clef_tt()
        .arg("openapi")
        .args(flags)
        .env("CLEF_API_KEY", "k")
        .output()
        .unwrap();
    assert_succeeded(&out);
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (_server, base, agent) = spawn_server(&flags, &[("CLEF_API_KEY", "k")]);
    let served = agent
        .get(&format!("{base}/openapi.json"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let served: Value = serde_json::from_str(&served).unwrap();
    assert_eq!(printed, served);
    assert_eq!(
        printed.pointer("/components/schemas/SystemOneRequest/properties/model/enum"),
        Some(&serde_json::json!(["clef", "clef-flash"]))
    );
}

#[test]
fn the_wire_types_are_the_bytes_the_server_sends() {
    let local = pipeline();
    let mut answered = 0;
    for (id, body) in golden_bodies() {
        if id == "truncation_16384" {
            continue; // 18k tokens; the shape is the same as every other answer's
        }
        match local.decide_body(body.as_bytes(), RULE, Some(&HostLimits::default())) {
            Ok(d) => {
                let typed: DecisionBody = serde_json::from_value(d.response.clone())
                    .unwrap_or_else(|e| panic!("{id}: {e}: {}", d.response));
                assert_eq!(serde_json::to_value(typed).unwrap(), d.response, "{id}");
                answered += 1;
            }
            Err(e) => {
                let typed: ErrorBody =
                    serde_json::from_value(clef_tt::api::error_body(&e)).unwrap();
                assert_eq!(
                    serde_json::to_value(typed).unwrap(),
                    clef_tt::api::error_body(&e),
                    "{id}"
                );
            }
        }
    }
    assert!(answered >= 30, "{answered}");
}

// ---- Regressions found by schemathesis ------------------------------------------------------

#[test]
fn an_empty_question_id_needs_instructions_on_the_server_and_in_the_document() {
    let base = start(settings(), 1, 8);
    let body =
        br#"{"model":"m","state":"s","questions":{"":{"type":"choice","criteria":{"1":"2"}}}}"#;
    let (status, _, text) = post(&base, body, &[]);
    assert_eq!(status, 422, "{text}");
    let err: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        err["detail"][0]["loc"],
        serde_json::json!(["body", "questions", "", "instructions"])
    );
    // With instructions the reference answers it, so the document may not forbid the id (the
    // first document asked for 1+ characters: schemathesis's negative_data_rejection found a
    // documented-invalid body answered 200); it asks for instructions instead.
    let with = br#"{"model":"m","state":"s","questions":{"":{"type":"noul","instructions":"?"}}}"#;
    assert_eq!(post(&base, with, &[]).0, 200);
    let doc = document(&settings());
    let questions = doc_get(
        &doc,
        "/components/schemas/SystemOneRequest/properties/questions",
    );
    assert!(questions["propertyNames"].get("minLength").is_none());
    assert_eq!(
        questions["patternProperties"]["^$"]["required"],
        serde_json::json!(["instructions"])
    );
    assert_eq!(
        questions["patternProperties"]["^$"]["properties"]["instructions"]["not"]["enum"],
        serde_json::json!([null, ""])
    );
}

/// What the reference accepts and the first document forbade (schemathesis's
/// `negative_data_rejection`: a body against its schema answered 200): the document now says it,
/// and the server still answers it.
#[test]
fn the_systemone_document_allows_what_the_reference_accepts() {
    let base = start(settings(), 1, 8);
    let q =
        |question: &str| format!(r#"{{"model":"m","state":"s","questions":{{"q":{question}}}}}"#);
    for body in [
        q(r#"{"type":"choice","instructions":"?","criteria":{"a":1,"b":2}}"#),
        q(r#"{"type":"choice","instructions":{"ask":"?"},"criteria":{"a":null,"b":["x"]}}"#),
        q(r#"{"type":"score","instructions":5,"criteria":{"low":1,"high":2}}"#),
        q(r#"{"type":"score","criteria":"abc"}"#),
        q(r#"{"type":"score","criteria":[1,null,true]}"#),
        q(r#"{"type":"noul","instructions":"?","criteria":{"true":1,"maybe":"ignored"}}"#),
        q(r#"{"type":"noul","instructions":"?","criteria":0}"#),
        q(r#"{"type":"noul","instructions":"?","criteria":[]}"#),
    ] {
        let (status, _, text) = post(&base, body.as_bytes(), &[]);
        assert_eq!(status, 200, "{body}: {text}");
    }
    let doc = document(&settings());
    let schema = |name: &str| doc_get(&doc, &format!("/components/schemas/{name}"));
    let choice = schema("ChoiceQuestion");
    assert_eq!(
        choice["properties"]["criteria"]["additionalProperties"],
        true
    );
    assert!(choice["properties"]["instructions"].get("type").is_none());
    let score = schema("ScoreQuestion")["properties"]["criteria"].clone();
    assert_eq!(branch_types(&score), ["array", "object", "string"]);
    assert_eq!(
        (
            score["anyOf"][0]["maxItems"].clone(),
            score["anyOf"][1]["maxProperties"].clone(),
            score["anyOf"][2]["maxLength"].clone()
        ),
        (10.into(), 10.into(), 10.into())
    );
    let noul = schema("NoulQuestion")["properties"]["criteria"].clone();
    assert_eq!(
        branch_types(&noul),
        ["object", "null", "boolean", "number", "string", "array"]
    );
    assert!(noul["anyOf"][0].get("additionalProperties").is_none());
    assert_eq!(noul["anyOf"][2]["const"], false);
    assert_eq!(
        (
            noul["anyOf"][3]["minimum"].clone(),
            noul["anyOf"][3]["maximum"].clone()
        ),
        (0.into(), 0.into())
    );
    assert_eq!(noul["anyOf"][4]["maxLength"], 0);
    assert_eq!(noul["anyOf"][5]["maxItems"], 0);
}

/// The `type` of each `anyOf` branch of `schema`.
fn branch_types(schema: &Value) -> Vec<String> {
    schema["anyOf"]
        .as_array()
        .unwrap_or_else(|| panic!("no anyOf: {schema}"))
        .iter()
        .map(|b| b["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// The hosted route's document is Workers AI's published schema with its described limits and
/// types: everything it forbids the server refuses (tests/workers_ai.rs has the refusals).
#[test]
fn the_hosted_document_is_the_published_schema() {
    let doc = document(&settings());
    let schema = |name: &str| doc_get(&doc, &format!("/components/schemas/WorkersAi{name}"));
    let request = schema("SystemOneRequest");
    assert_eq!(request["additionalProperties"], false);
    assert_eq!(
        request["required"],
        serde_json::json!(["model", "state", "questions"])
    );
    assert_eq!(
        branch_types(&request["properties"]["state"]),
        ["string", "object", "array"]
    );
    assert_eq!(
        request["properties"]["images"]["type"], "array",
        "null is no list of images"
    );
    assert_eq!(request["properties"]["images"]["maxItems"], 4);
    let names = &request["properties"]["questions"]["propertyNames"];
    assert_eq!(
        (names["minLength"].clone(), names["maxLength"].clone()),
        (1.into(), 100.into())
    );
    assert_eq!(names["pattern"], "^[A-Za-z0-9_.-]+$");
    let image = schema("Image");
    assert_eq!(image["anyOf"][0]["pattern"], "^[Dd][Aa][Tt][Aa]:");
    for kind in ["NoulQuestion", "ChoiceQuestion", "ScoreQuestion"] {
        let q = schema(kind);
        assert_eq!(q["additionalProperties"], false, "{kind}");
        assert!(
            q["required"]
                .as_array()
                .unwrap()
                .contains(&"instructions".into()),
            "{kind}"
        );
        let instructions = &q["properties"]["instructions"];
        assert_eq!(branch_types(instructions), ["string", "object", "array"]);
        assert_eq!(
            (
                instructions["anyOf"][0]["minLength"].clone(),
                instructions["anyOf"][1]["minProperties"].clone(),
                instructions["anyOf"][2]["minItems"].clone()
            ),
            (1.into(), 1.into(), 1.into())
        );
    }
    let options = &schema("ChoiceQuestion")["properties"]["criteria"];
    assert_eq!(
        branch_types(&options["additionalProperties"]),
        ["string", "object", "array", "null"]
    );
    assert_eq!(options["propertyNames"]["minLength"], 1);
    assert_eq!(
        (
            options["minProperties"].clone(),
            options["maxProperties"].clone()
        ),
        (2.into(), 255.into())
    );
    let levels = &schema("ScoreQuestion")["properties"]["criteria"];
    assert_eq!(
        branch_types(&levels["items"]),
        ["string", "object", "array"]
    );
    assert_eq!(
        (levels["minItems"].clone(), levels["maxItems"].clone()),
        (2.into(), 10.into())
    );
    assert_eq!(schema("NoulCriteria")["additionalProperties"], false);
    // The body `model` of each operation is its path's, spaces around it as JavaScript's `\s`.
    let op = doc_get(
        &doc,
        &format!(
            "{}/post/requestBody/content/application~1json/schema",
            path("/accounts/{account_id}/ai/run/@cf/cloudflare/clef-flash")
        ),
    );
    let pattern = op["properties"]["model"]["pattern"].as_str().unwrap();
    assert!(
        pattern.contains("(clef-flash)")
            && pattern.contains(r"\u00a0")
            && pattern.contains(r"\ufeff"),
        "{pattern}"
    );
    assert!(!pattern.contains(r"\u0085"));
    // No media without a vision tower.
    let mut s = settings();
    s.media = None;
    assert_eq!(
        doc_get(
            &document(&s),
            "/components/schemas/WorkersAiSystemOneRequest/properties/images/maxItems"
        ),
        0
    );
}

#[test]
fn a_method_a_route_does_not_take_gets_a_405_with_the_error_body() {
    let base = start(settings(), 1, 8);
    for (method, route) in [("GET", "/v1/systemone"), ("DELETE", "/v1/models")] {
        let r = agent()
            .run(
                ureq::http::Request::builder()
                    .method(method)
                    .uri(format!("{base}{route}"))
                    .body(())
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(r.status().as_u16(), 405, "{method} {route}");
        assert!(r.headers().get("x-request-id").is_some());
        let body: Value = serde_json::from_str(&r.into_body().read_to_string().unwrap()).unwrap();
        assert_eq!(body["detail"][0]["type"], "method_not_allowed");
    }
}

// ---- Every body of the documented request type is answered ----------------------------------

fn text() -> impl Strategy<Value = String> + Clone {
    "[A-Za-z0-9 _.,?!'é-]{1,24}"
}

/// Any JSON value the document allows where it says "any": text mostly, then numbers, booleans,
/// null and small lists and objects of text.
fn json_value() -> impl Strategy<Value = Value> + Clone {
    prop_oneof![
        4 => text().prop_map(Value::from),
        1 => any::<i32>().prop_map(Value::from),
        1 => (-1e6f64..1e6).prop_map(Value::from),
        1 => any::<bool>().prop_map(Value::from),
        1 => Just(Value::Null),
        1 => proptest::collection::vec(text(), 0..3).prop_map(Value::from),
        1 => proptest::collection::vec((text(), text()), 0..3)
            .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k, Value::from(v))).collect())),
    ]
}

fn question() -> impl Strategy<Value = QuestionBody> {
    let instructions = || proptest::option::of(json_value());
    let noul_criteria = prop_oneof![
        (
            proptest::option::of(json_value()),
            proptest::option::of(json_value()),
            proptest::option::of(text())
        )
            .prop_map(|(yes, no, extra)| {
                let mut o = serde_json::Map::new();
                if let Some(v) = yes {
                    o.insert("true".into(), v);
                }
                if let Some(v) = no {
                    o.insert("false".into(), v);
                }
                if let Some(v) = extra {
                    o.insert("note".into(), Value::from(v));
                }
                Value::Object(o)
            }),
        prop_oneof![
            Just(Value::Null),
            Just(Value::from(false)),
            Just(Value::from(0)),
            Just(Value::from("")),
            Just(Value::Array(vec![]))
        ],
    ];
    let levels = prop_oneof![
        proptest::collection::vec(json_value(), 1..10).prop_map(Value::from),
        proptest::collection::vec((text(), json_value()), 1..10)
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        "[a-zé]{1,10}".prop_map(Value::from),
    ];
    prop_oneof![
        (instructions(), proptest::option::of(noul_criteria)).prop_map(
            |(instructions, criteria)| {
                QuestionBody::Noul(NoulQuestion {
                    instructions,
                    criteria,
                })
            }
        ),
        (
            instructions(),
            proptest::collection::vec((text(), json_value()), 1..6)
        )
            .prop_map(|(instructions, options)| {
                QuestionBody::Choice(ChoiceQuestion {
                    instructions,
                    criteria: options.into_iter().collect::<IndexMap<_, _>>(),
                })
            }),
        (instructions(), levels).prop_map(|(instructions, criteria)| {
            QuestionBody::Score(ScoreQuestion {
                instructions,
                criteria,
            })
        }),
    ]
}

fn documented_body() -> impl Strategy<Value = SystemOneBody> {
    (
        text(),
        json_value(),
        proptest::collection::vec(("[A-Za-z0-9_.-]{1,12}", question()), 1..5),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(|(model, state, questions, truncate)| SystemOneBody {
            model,
            state,
            questions: questions.into_iter().collect(),
            images: None,
            videos: None,
            truncate,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_body_of_the_documented_type_is_answered(body in documented_body()) {
        let bytes = serde_json::to_vec(&body).unwrap();
        let decision = shared_pipeline()
            .decide_body(&bytes, RULE, Some(&HostLimits::default()))
            .map_err(|e| TestCaseError::fail(format!("{} {}: {}", e.status, e.msg,
                String::from_utf8_lossy(&bytes))))?;
        let answer: DecisionBody = serde_json::from_value(decision.response).unwrap();
        prop_assert_eq!(answer.answers.len(), body.questions.len());
    }
}
