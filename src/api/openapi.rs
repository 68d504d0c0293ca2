//! The HTTP contract as an OpenAPI 3.1 document: `GET /openapi.json` (never behind the key) and
//! `clef-tt openapi`.
//!
//! Schemas come from the wire types of `contract/` (schemars, JSON Schema 2020-12, the
//! dialect of OpenAPI 3.1): requests with the deserialising contract, responses with the
//! serialising one. The limits the server was started with ([`ServerSettings`]: questions,
//! options, levels, id length, strict rules, media counts, served model names, body bytes,
//! token limits) are then written into those schemas, so the document describes this server
//! and not a default one. Paths, status codes and headers are listed here, next to the
//! constants the routes use.

use super::contract::{
    model_pattern, DecisionBody, ErrorBody, HealthBody, ModelList, SystemOneBody, WorkersAiBody,
    WorkersAiEnvelope, PREFIX_CACHE_HEADER, REQUEST_ID_HEADER,
};
use super::state::ServerSettings;
use super::workers_ai;
use crate::encode::state_key::STATE_KEY_HEADER;
use crate::encode::LengthRule;
use crate::engine::prefix_cache::CacheUse;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

/// Where schemas live in the document.
const SCHEMAS: &str = "/components/schemas";

/// The document for a server started with `settings`.
pub fn document(settings: &ServerSettings) -> Value {
    let mut schemas = Map::new();
    let request = schema_refs::<SystemOneBody>(SchemaSettings::draft2020_12(), &mut schemas);
    let serialize = || SchemaSettings::draft2020_12().for_serialize();
    let decision = schema_refs::<DecisionBody>(serialize(), &mut schemas);
    let error = schema_refs::<ErrorBody>(serialize(), &mut schemas);
    let health = schema_refs::<HealthBody>(serialize(), &mut schemas);
    let models = schema_refs::<ModelList>(serialize(), &mut schemas);
    discriminate(&mut schemas, "Question");
    discriminate(&mut schemas, "Answer");
    // The engine leaves it to the HTTP server, which always sets it.
    require(&mut schemas, "SystemOneResponse", "latency_ms");
    apply_limits(&mut schemas, settings);

    let guarded = settings.api_key.is_some();
    let mut decide_errors = vec![
        (400, "A compressed body that cannot be decoded."),
        (
            404,
            "The model is not one of the served names (`CLEF_MODEL_NAMES`).",
        ),
        (
            413,
            "The body is larger than the limit (before or after decoding).",
        ),
        (
            415,
            "A Content-Type other than JSON, or a Content-Encoding other than gzip or zstd.",
        ),
        (
            422,
            "The body is not JSON, or not a valid request (`detail[0].loc` names the field), \
             or the prompt is longer than the token limits (`type` `max_tokens_exceeded`; \
             send `truncate: true` to cut the state instead).",
        ),
        (
            500,
            "The worker failed on this request (the server goes on).",
        ),
        (
            503,
            "The server is shutting down, or its device stopped answering (`type` \
             `device_unavailable`): retry after `Retry-After` seconds, on another replica.",
        ),
    ];
    if guarded {
        decide_errors.push((401, "Missing or wrong `Authorization: Bearer <key>`."));
    }
    let mut decide_responses = Map::new();
    decide_responses.insert(
        "200".into(),
        json!({
            "description": "One answer per question.",
            "headers": {
                REQUEST_ID_HEADER: request_id_header(),
                PREFIX_CACHE_HEADER: {
                    "description": "How this decision used the prefix cache of its worker.",
                    "required": true,
                    "schema": {"type": "string", "enum": CacheUse::ALL.map(CacheUse::name)},
                },
                STATE_KEY_HEADER: {
                    "description": "The server's routing key of this request's state piece: \
                        SHA-256 (hex) of the rendered state, then a 0x00 byte and each image \
                        and video frame as sent. Send it back as a request header so a \
                        balancer hashing it keeps a state on one replica's prefix cache.",
                    "required": true,
                    "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                },
            },
            "content": {"application/json": {"schema": decision}},
        }),
    );
    for (status, text) in decide_errors {
        decide_responses.insert(status.to_string(), error_response(&error, text));
    }
    decide_responses.insert(
        "429".into(),
        json!({
            "description": "The queue is full; retry after `Retry-After` seconds.",
            "headers": {
                REQUEST_ID_HEADER: request_id_header(),
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "required": true,
                    "schema": {"type": "string", "pattern": "^[0-9]+$"},
                },
            },
            "content": {"application/json": {"schema": error}},
        }),
    );

    let mut model_responses = Map::new();
    model_responses.insert(
        "200".into(),
        json!({
            "description": "The served model under each of its names, with the server's limits.",
            "headers": {REQUEST_ID_HEADER: request_id_header()},
            "content": {"application/json": {"schema": models}},
        }),
    );
    if guarded {
        model_responses.insert(
            "401".into(),
            error_response(&error, "Missing or wrong `Authorization: Bearer <key>`."),
        );
    }
    let security = if guarded {
        json!([{"bearer": []}])
    } else {
        json!([])
    };

    let health_op = |id: &str| {
        json!({"get": {
            "operationId": id,
            "summary": "Readiness: 200 once every worker is warm, 503 before (out of rotation), and \
                        503 for good once a device stopped answering (`status` `device_hung`, \
                        `reason`; the process exits after its drain window).",
            "security": [],
            "responses": {
                "200": {"description": "Ready.", "headers": {REQUEST_ID_HEADER: request_id_header()},
                        "content": {"application/json": {"schema": health}}},
                "503": {"description": "Warming up, or a device stopped answering.", "headers": {REQUEST_ID_HEADER: request_id_header()},
                        "content": {"application/json": {"schema": health}}},
            },
        }})
    };
    let mut paths = Map::new();
    paths.insert(
        "/v1/systemone".into(),
        json!({"post": {
            "operationId": "decide",
            "summary": "Answer typed questions about a state in one prefill pass.",
            "description": decide_description(settings),
            "security": security,
            "parameters": [{
                "name": STATE_KEY_HEADER,
                "in": "header",
                "required": false,
                "description": "Any string; load balancers hash it to keep repeats of a state \
                    on one replica (clef-tt's own clients send the key the server returns; \
                    deploy/haproxy/haproxy.cfg computes it for a text state without media, \
                    SHA-256 of the state's UTF-8, when a client sends none).",
                "schema": {"type": "string"},
            }],
            "requestBody": {
                "required": true,
                "content": {"application/json": {"schema": request}},
            },
            "responses": decide_responses,
        }}),
    );
    paths.insert(
        "/v1/models".into(),
        json!({"get": {
            "operationId": "listModels",
            "summary": "The served model, its device, limits and counters.",
            "security": security,
            "responses": model_responses,
        }}),
    );
    paths.insert("/health".into(), health_op("health"));
    paths.insert("/v1/health".into(), health_op("healthV1"));
    let mut open_routes = vec![
        (
            "/metrics",
            "metrics",
            "text/plain",
            "Prometheus text exposition of requests, queue, tokens, cache and device.",
            json!({"type": "string"}),
        ),
        (
            "/openapi.json",
            "openapi",
            "application/json",
            "This document (OpenAPI 3.1).",
            json!({"type": "object"}),
        ),
    ];
    if settings.demo {
        let text = || json!({"type": "string"});
        open_routes.extend([
            ("/", "demoPage", "text/html", "The demo page.", text()),
            (
                "/demo/app.js",
                "demoScript",
                "text/javascript",
                "The demo page's script.",
                text(),
            ),
            (
                "/demo/style.css",
                "demoStyle",
                "text/css",
                "The demo page's styles.",
                text(),
            ),
        ]);
    }
    for (path, id, mime, what, schema) in open_routes {
        paths.insert(
            path.into(),
            json!({"get": {
                "operationId": id,
                "summary": what,
                "security": [],
                "responses": {"200": {"description": what,
                    "content": {mime: {"schema": schema}}}},
            }}),
        );
    }

    workers_ai_paths(settings, &mut paths, &mut schemas);

    let mut components = json!({"schemas": schemas});
    if guarded {
        components["securitySchemes"] = json!({"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "The server's `CLEF_API_KEY`.",
        }});
    }
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "clef-tt",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Cloudflare Clef decision models: a state and typed questions in, a \
                probability for every allowed option out. Limits in this document are the \
                ones this server was started with.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "paths": paths,
        "components": components,
    })
}

/// Workers AI's route for each served hosted model id, with and without `/client/v4`: the
/// hosted request (`WorkersAi*` schemas: the published schema's types and limits, no unknown
/// fields, the path's body `model`), answers and refusals in the envelope.
fn workers_ai_paths(
    settings: &ServerSettings,
    paths: &mut Map<String, Value>,
    schemas: &mut Map<String, Value>,
) {
    let hosted_request = schema_refs::<WorkersAiBody>(SchemaSettings::draft2020_12(), schemas);
    discriminate(schemas, "WorkersAiQuestion");
    apply_hosted_limits(schemas, settings);
    let serialize = || SchemaSettings::draft2020_12().for_serialize();
    let envelope = schema_refs::<WorkersAiEnvelope>(serialize(), schemas);
    let (success, failure) = (envelope.clone(), envelope);

    let guarded = settings.api_key.is_some();
    let id_header = json!({
        "description": "This request's id, as `x-request-id` (the client's own when well formed).",
        "required": true,
        "schema": {"type": "string"},
    });
    let refusal = |text: &str| {
        json!({
            "description": text,
            "headers": {workers_ai::REQUEST_ID_HEADER: id_header, REQUEST_ID_HEADER: request_id_header()},
            "content": {"application/json": {"schema": failure}},
        })
    };
    let mut responses = Map::new();
    responses.insert(
        "200".into(),
        json!({
            "description": "`result` is the `/v1/systemone` answer.",
            "headers": {
                workers_ai::REQUEST_ID_HEADER: id_header,
                REQUEST_ID_HEADER: request_id_header(),
                STATE_KEY_HEADER: {"required": true, "schema": {"type": "string"}},
                PREFIX_CACHE_HEADER: {"required": true, "schema": {"type": "string"}},
            },
            "content": {"application/json": {"schema": success}},
        }),
    );
    for (status, text) in [
        (
            "400",
            "6003 malformed JSON; 5006 not a request; 7000 unknown model.",
        ),
        ("413", "5021: the body or the prompt is too long."),
        ("415", "6003: not JSON."),
        (
            "422",
            "5012: a hosted rule (count, id, instructions, unknown field, image).",
        ),
        ("500", "5000: the worker failed."),
        (
            "503",
            "3040: shutting down, or the device stopped answering.",
        ),
    ] {
        responses.insert(status.into(), refusal(text));
    }
    if guarded {
        responses.insert(
            "401".into(),
            refusal("10000: missing or wrong bearer token."),
        );
    }
    if settings.account_id.is_some() {
        responses.insert("404".into(), refusal("7003: not this server's account."));
    }
    let mut busy = refusal("3040: the queue is full; retry after `Retry-After` seconds.");
    busy["headers"]["Retry-After"] = json!({"required": true, "schema": {"type": "string"}});
    responses.insert("429".into(), busy);
    let account = match &settings.account_id {
        Some(id) => json!({"type": "string", "enum": [id]}),
        None => json!({"type": "string", "minLength": 1}),
    };
    let names = &settings.model_names;
    let security = if guarded {
        json!([{"bearer": []}])
    } else {
        json!([])
    };
    for prefix in ["/client/v4", ""] {
        for (model, selector) in workers_ai::MODELS {
            if !names.is_empty() && !names.iter().any(|n| n == selector) {
                continue;
            }
            let id = format!(
                "workersAi{}{}",
                if prefix.is_empty() { "" } else { "V4" },
                if selector == "clef" {
                    "Clef"
                } else {
                    "ClefFlash"
                }
            );
            paths.insert(
                format!("{prefix}/accounts/{{account_id}}/ai/run/{model}"),
                json!({"post": {
                    "operationId": id,
                    "summary": format!("Workers AI's {model}: the decision in Cloudflare's envelope."),
                    "security": security,
                    "parameters": [{"name": "account_id", "in": "path", "required": true,
                        "description": "Any account id unless the server sets `CLEF_ACCOUNT_ID`.",
                        "schema": account}],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {
                        "allOf": [hosted_request],
                        "properties": {"model": {"type": "string",
                            "pattern": model_pattern(&[selector])}},
                    }}}},
                    "responses": responses,
                }}),
            );
        }
    }
}

/// A `$ref` to `T`'s schema; `T`'s definitions (and its own) go into `schemas`.
fn schema_refs<T: JsonSchema>(settings: SchemaSettings, schemas: &mut Map<String, Value>) -> Value {
    let mut generator = SchemaGenerator::new(settings.with(|s| {
        s.definitions_path = SCHEMAS.into();
        s.meta_schema = None;
    }));
    let reference = generator.subschema_for::<T>().to_value();
    for (name, schema) in generator.take_definitions(true) {
        schemas.entry(name).or_insert(schema);
    }
    reference
}

fn request_id_header() -> Value {
    json!({
        "description": "This request's id: the request's own `x-request-id` when it sent a \
            well-formed one (1 to 128 visible ASCII characters, `!` to `~`), else one the \
            server made. Also `x-typesafe-request-id`, and in every log line about the request.",
        "required": true,
        "schema": {"type": "string"},
    })
}

fn error_response(error: &Value, description: &str) -> Value {
    json!({
        "description": description,
        "headers": {REQUEST_ID_HEADER: request_id_header()},
        "content": {"application/json": {"schema": error}},
    })
}

fn decide_description(settings: &ServerSettings) -> String {
    let tokens = match settings.rule {
        LengthRule::Server {
            max_state,
            max_tail,
            truncate,
        } => format!(
            "The state may take {max_state} tokens and the questions {max_tail}; a longer \
             prompt is {} unless `truncate` says otherwise.",
            if truncate {
                "cut to fit"
            } else {
                "refused with 422 (`max_tokens_exceeded`)"
            }
        ),
        LengthRule::Reference { max_length } => {
            format!("Prompts are cut to {max_length} tokens, as the reference does.")
        }
    };
    format!(
        "Bodies up to {} bytes (after gzip or zstd decoding). {tokens} Every question is \
         answered jointly with the others.",
        settings.max_body_bytes
    )
}

/// Write the server's limits into the generated schemas.
fn apply_limits(schemas: &mut Map<String, Value>, settings: &ServerSettings) {
    let limits = &settings.limits;
    let set = |schemas: &mut Map<String, Value>, name: &str, pointer: &str, values: Value| {
        extend(schemas, name, pointer, values)
    };
    let mut questions = json!({"minProperties": 1, "maxProperties": limits.max_questions});
    if limits.strict {
        questions["propertyNames"] = json!({"minLength": 1,
            "maxLength": limits.max_id_chars.min(100), "pattern": ID_PATTERN});
    } else {
        // Any id, but an empty one needs instructions that render to some text (without them
        // the question id is its instruction, and an empty span is refused).
        questions["propertyNames"] = json!({"maxLength": limits.max_id_chars});
        questions["patternProperties"] = json!({"^$": {
            "allOf": [{"$ref": format!("#{SCHEMAS}/Question")}],
            "required": ["instructions"],
            "properties": {"instructions": {"not": {"enum": [null, ""]}}},
        }});
    }
    set(
        schemas,
        "SystemOneRequest",
        "/properties/questions",
        questions,
    );
    if !settings.model_names.is_empty() {
        set(
            schemas,
            "SystemOneRequest",
            "/properties/model",
            json!({"enum": settings.model_names}),
        );
    }
    let least = if limits.strict { 2 } else { 1 };
    set(
        schemas,
        "ChoiceQuestion",
        "/properties/criteria",
        json!({"minProperties": least, "maxProperties": limits.max_choice_options}),
    );
    // Score levels: a list, an object (its keys) or a string (its characters).
    let levels = limits.max_score_levels;
    for (branch, bounds) in [
        ("0", json!({"minItems": least, "maxItems": levels})),
        (
            "1",
            json!({"minProperties": least, "maxProperties": levels}),
        ),
        ("2", json!({"minLength": least, "maxLength": levels})),
    ] {
        let pointer = format!("/properties/criteria/anyOf/{branch}");
        set(schemas, "ScoreQuestion", &pointer, bounds);
    }
    if limits.strict {
        // `--strict`: instructions required and truthy in Python's sense.
        for name in ["NoulQuestion", "ChoiceQuestion", "ScoreQuestion"] {
            set(
                schemas,
                name,
                "/properties/instructions",
                json!({"not": {"enum": [null, false, 0, "", [], {}]}}),
            );
            require(schemas, name, "instructions");
        }
    }
    let (images, videos, frames) = match &settings.media {
        Some(m) => (m.max_images, m.max_videos, m.max_frames),
        None => (0, 0, 0),
    };
    set(
        schemas,
        "SystemOneRequest",
        "/properties/images",
        json!({"maxItems": images}),
    );
    set(
        schemas,
        "SystemOneRequest",
        "/properties/videos",
        json!({"maxItems": videos}),
    );
    set(
        schemas,
        "SystemOneRequest",
        "/properties/videos/items",
        json!({"minItems": 1, "maxItems": frames}),
    );
}

/// Write the hosted limits (the server's, no looser than Workers AI's) into the `WorkersAi*`
/// schemas.
fn apply_hosted_limits(schemas: &mut Map<String, Value>, settings: &ServerSettings) {
    let limits = workers_ai::hosted_limits(&settings.limits);
    let set = |schemas: &mut Map<String, Value>, name: &str, pointer: &str, values: Value| {
        extend(schemas, name, pointer, values)
    };
    set(
        schemas,
        "WorkersAiSystemOneRequest",
        "/properties/questions",
        json!({"minProperties": 1, "maxProperties": limits.max_questions,
               "propertyNames": {"minLength": 1, "maxLength": limits.max_id_chars,
                                 "pattern": ID_PATTERN}}),
    );
    set(
        schemas,
        "WorkersAiSystemOneRequest",
        "/properties/images",
        json!({"maxItems": workers_ai::max_images(settings)}),
    );
    set(
        schemas,
        "WorkersAiChoiceQuestion",
        "/properties/criteria",
        json!({"minProperties": 2, "maxProperties": limits.max_choice_options}),
    );
    set(
        schemas,
        "WorkersAiScoreQuestion",
        "/properties/criteria",
        json!({"minItems": 2, "maxItems": limits.max_score_levels}),
    );
    // No field the hosted API does not know (the `type` tag is in the properties by now).
    for name in [
        "WorkersAiNoulQuestion",
        "WorkersAiChoiceQuestion",
        "WorkersAiScoreQuestion",
    ] {
        set(schemas, name, "", json!({"additionalProperties": false}));
    }
}

/// Question ids under `--strict` and on the hosted route.
const ID_PATTERN: &str = "^[A-Za-z0-9_.-]+$";

/// Move the `type` tag of each variant of the internally tagged enum `name` into the variant's
/// own schema and name it as the OpenAPI discriminator, so client generators see
/// `NoulQuestion { type: "noul", ... }` rather than a bare reference beside a tag.
fn discriminate(schemas: &mut Map<String, Value>, name: &str) {
    let Some(variants) = schemas
        .get_mut(name)
        .and_then(|s| s.get_mut("oneOf"))
        .and_then(Value::as_array_mut)
        .map(std::mem::take)
    else {
        return;
    };
    let mut mapping = Map::new();
    let mut refs = Vec::new();
    for variant in variants {
        let reference = variant["$ref"].as_str().unwrap_or_default().to_string();
        let target = reference.rsplit('/').next().unwrap_or_default().to_string();
        let tag = variant.pointer("/properties/type/const").cloned();
        if let (Some(Value::String(tag)), Some(schema)) = (tag, schemas.get_mut(&target)) {
            if let (Some(props), Some(tag_schema)) = (
                schema.get_mut("properties").and_then(Value::as_object_mut),
                variant.pointer("/properties/type"),
            ) {
                props.insert("type".into(), tag_schema.clone());
            }
            mapping.insert(tag, Value::from(reference.clone()));
            require(schemas, &target, "type");
        }
        refs.push(json!({"$ref": reference}));
    }
    if let Some(schema) = schemas.get_mut(name) {
        schema["oneOf"] = Value::Array(refs);
        schema["discriminator"] = json!({"propertyName": "type", "mapping": mapping});
    }
}

/// Add `field` to the `required` list of schema `name`.
fn require(schemas: &mut Map<String, Value>, name: &str, field: &str) {
    let Some(schema) = schemas.get_mut(name) else {
        return;
    };
    match schema.get_mut("required").and_then(Value::as_array_mut) {
        Some(required) => required.push(Value::from(field)),
        None => schema["required"] = json!([field]),
    }
}

/// Merge `values` into the object at `pointer` of schema `name` (a missing target is left
/// alone: the tests check every limit lands).
fn extend(schemas: &mut Map<String, Value>, name: &str, pointer: &str, values: Value) {
    let target = schemas
        .get_mut(name)
        .and_then(|s| s.pointer_mut(pointer))
        .and_then(Value::as_object_mut);
    if let (Some(target), Value::Object(values)) = (target, values) {
        target.extend(values);
    }
}
