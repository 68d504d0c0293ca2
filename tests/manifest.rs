//! The tt-model package as the published document `tt_kernel_manifest.json` (the file tt-model
//! reads by that name): its wire shape as tt-model's `Manifest` model takes it (schema 5.1,
//! `entrypoint`/`mesh` null or objects, an image reference in tt-model's form, serve settings
//! without unknown keys), every variable it sets read by `clef-tt serve`, the launcher module
//! it names present, and `profiles/p150x{2,4}.toml` holding the same serve settings. The
//! authored `tt-model.yaml` is checked against tt-model's authoring rules by
//! `tests/tt_model/check_package.py` (PyYAML, as tt-model loads it).

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(root().join("tt_kernel_manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn env_of(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// The fields of tt-model's `ServeSettings` (extra keys are refused there).
const SERVE_FIELDS: [&str; 11] = [
    "hardware",
    "mesh_device",
    "port",
    "max_model_len",
    "max_num_seqs",
    "block_size",
    "server_timeout",
    "capabilities",
    "additional_config",
    "args",
    "env",
];

#[test]
fn the_published_manifest_has_the_wire_shape_tt_model_reads() {
    let m = manifest();
    assert_eq!(m["schema_version"], "5.1");
    for key in ["name", "tt_metal_version", "arch"] {
        assert!(m[key].as_str().is_some_and(|s| !s.is_empty()), "{key}");
    }
    assert_eq!(m["arch"], "blackhole");
    assert_eq!(m["device_count"], 2);
    for key in ["tt_kernel_version", "created_at"] {
        assert!(m["producer"][key].is_string(), "producer.{key}");
    }
    assert_eq!(m["weights"]["repo"], "Cloudflare/clef");
    assert_eq!(
        m["weights"]["revision"],
        "2f3de3dd85f379784083b0814d997ab627200f0c"
    );
    // tt-model's `entrypoint` is an object {class, arch_name} or null (a string fails its
    // model, and the loader then falls through to treating the path as a hub id); `mesh` is an
    // object or null. The container path uses neither: null, as tt-model's own to_wire writes.
    for key in ["entrypoint", "mesh", "resources", "capabilities"] {
        assert!(
            m[key].is_null(),
            "{key} must be null for a container package"
        );
    }

    let c = &m["container"];
    assert_eq!(c["kind"], "tt-dit-server");
    // registry "hf": the tag is the image reference `docker run` gets, tt-model/<name>:<tag>;
    // the digest is null (matches whatever image carries the tag) or a sha256 — never "".
    let image = &c["image"];
    assert_eq!(image["registry"], "hf");
    let tag = image["tag"].as_str().unwrap();
    let (repository, version) = tag.split_once(':').unwrap();
    assert_eq!(
        repository,
        format!("tt-model/{}", m["name"].as_str().unwrap())
    );
    assert!(!version.is_empty() && !version.contains('/'), "{tag}");
    match &image["digest"] {
        Value::Null => {}
        Value::String(d) => assert!(
            d.strip_prefix("sha256:")
                .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())),
            "digest {d:?}"
        ),
        other => panic!("digest {other}"),
    }

    // The ASGI app tt-model will import exists.
    let app = c["runtime"]["app"].as_str().unwrap();
    let (module, attr) = app.split_once(':').unwrap();
    let file = root().join(format!("{}.py", module.replace('.', "/")));
    let source =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert!(source.contains(&format!("async def {attr}(")), "{app}");
    assert_eq!(c["runtime"]["mesh_shape_env"], "CLEF_MESH_SHAPE");
    // runtime.packages: clef-tt's wheel (an empty list installs tt-model's default stack
    // instead), plus what tt-model's build-time check imports; no ttnn, which would replace the
    // image's one tt-metal (the source build of source.tt_metal, a local checkout at v0.81.1).
    let packages: Vec<&str> = c["runtime"]["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let wheel = packages
        .iter()
        .find_map(|p| p.strip_prefix("clef-tt @ file:///opt/tt-metal/clef-tt-wheel/"))
        .expect("the clef-tt wheel");
    assert!(
        wheel.starts_with(&format!("clef_tt-{}-py3-none-", env!("CARGO_PKG_VERSION"))),
        "{wheel} is not this version's wheel"
    );
    assert!(
        !packages.iter().any(|p| p.starts_with("ttnn")),
        "a ttnn package would be a second tt-metal: {packages:?}"
    );
    for needed in ["uvicorn", "fastapi", "pydantic"] {
        assert!(
            packages.iter().any(|p| p.starts_with(needed)),
            "{needed} (tt-model's verify imports it)"
        );
    }

    for key in keys(&c["serve"]) {
        assert!(
            SERVE_FIELDS.contains(&key),
            "serve.{key} is not a serve setting"
        );
    }
    let profiles = c["serve_profiles"].as_array().unwrap();
    for p in profiles {
        for key in keys(p) {
            assert!(
                SERVE_FIELDS.contains(&key) || key == "name" || key == "description",
                "serve_profiles[].{key} is not a serve setting"
            );
        }
    }
    let names: Vec<&str> = profiles
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["p150x2", "p150x4"]);
    assert_eq!(c["default_profile"], "p150x2");
    assert!(c["verify"].as_array().is_some_and(|v| !v.is_empty()));
    assert_eq!(c["serve"]["port"], 8008);
}

#[test]
fn every_setting_of_the_package_is_one_clef_tt_serve_reads() {
    let m = manifest();
    let c = &m["container"];
    let help = Command::new(env!("CARGO_BIN_EXE_clef-tt"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let serve_env = env_of(&c["serve"]["env"]);
    let profiles = c["serve_profiles"].as_array().unwrap();
    let profile_envs: Vec<BTreeMap<String, String>> =
        profiles.iter().map(|p| env_of(&p["env"])).collect();
    let mut all: Vec<&String> = serve_env.keys().collect();
    all.extend(profile_envs.iter().flat_map(|e| e.keys()));
    // What tt-model's launcher and mounts set: the weights and the tensor cache.
    assert!(help.contains("[env: TT_CACHE_PATH="), "TT_CACHE_PATH");
    for var in all {
        assert!(
            help.contains(&format!("[env: {var}=")),
            "{var} is not read by clef-tt serve"
        );
    }
    // Two 1x2 workers on p150x4, one on p150x2.
    assert_eq!(profile_envs[0]["CLEF_MESH_SHAPE"], "1x2");
    assert_eq!(profile_envs[0]["CLEF_WORKERS"], "1");
    assert_eq!(profile_envs[1]["CLEF_MESH_SHAPE"], "1x2");
    assert_eq!(profile_envs[1]["CLEF_WORKERS"], "2");
    // tt-model kills 120 s after SIGTERM: the drain ends before that.
    let drain: u64 = serve_env["CLEF_SHUTDOWN_TIMEOUT"].parse().unwrap();
    assert!(drain < 120, "{drain}");

    // The TOML profiles hold the same settings: serve.env with the profile's env over it.
    for (p, profile_env) in profiles.iter().zip(&profile_envs) {
        let name = p["name"].as_str().unwrap();
        let text = std::fs::read_to_string(root().join(format!("profiles/{name}.toml"))).unwrap();
        let toml: toml::Table = toml::from_str(&text).unwrap();
        let mut want = serve_env.clone();
        want.extend(profile_env.clone());
        let got: BTreeMap<String, String> = toml["env"]
            .as_table()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        assert_eq!(got, want, "{name}");
        assert_eq!(toml["port"].as_integer(), Some(8008));
    }
}
