//! The tt-model package: `manifest.json` in the schema 5.1 wire format (the fields of
//! spec/tenstorrent.md §7), every variable it sets read by `clef-tt serve`, the launcher module
//! it names present, and `profiles/p150x{2,4}.toml` holding the same serve settings.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
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

#[test]
fn the_manifest_is_a_schema_5_1_package_of_this_server() {
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(m["schema_version"], "5.1");
    assert_eq!(m["arch"], "blackhole");
    assert_eq!(m["device_count"], 2);
    assert!(m["name"].as_str().is_some_and(|n| !n.is_empty()));
    assert_eq!(m["weights"]["repo"], "Cloudflare/clef");
    assert_eq!(
        m["weights"]["revision"],
        "2f3de3dd85f379784083b0814d997ab627200f0c"
    );
    for key in [
        "tt_metal_version",
        "producer",
        "mesh",
        "entrypoint",
        "resources",
        "capabilities",
        "env",
    ] {
        assert!(!m[key].is_null(), "missing {key}");
    }
    let c = &m["container"];
    assert_eq!(c["kind"], "tt-dit-server");
    for key in [
        "image",
        "runtime",
        "serve",
        "serve_profiles",
        "default_profile",
        "code_dir",
        "verify",
        "built",
        "card",
    ] {
        assert!(!c[key].is_null(), "missing container.{key}");
    }
    // The ASGI app tt-model will import exists.
    let app = c["runtime"]["app"].as_str().unwrap();
    let (module, attr) = app.split_once(':').unwrap();
    let file = root().join(format!("{}.py", module.replace('.', "/")));
    let source =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert!(source.contains(&format!("async def {attr}(")), "{app}");
    assert_eq!(c["runtime"]["mesh_shape_env"], "CLEF_MESH_SHAPE");
    assert_eq!(c["serve"]["port"], 8008);
    assert!(c["verify"].as_array().is_some_and(|v| !v.is_empty()));
    let profiles = c["serve_profiles"].as_array().unwrap();
    let names: Vec<&str> = profiles
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["p150x2", "p150x4"]);
    assert_eq!(c["default_profile"], "p150x2");

    // Every variable the package sets is one `clef-tt serve` reads.
    let help = Command::new(env!("CARGO_BIN_EXE_clef-tt"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let serve_env = env_of(&c["serve"]["env"]);
    let mut all: Vec<&String> = serve_env.keys().collect();
    let profile_envs: Vec<BTreeMap<String, String>> =
        profiles.iter().map(|p| env_of(&p["env"])).collect();
    all.extend(profile_envs.iter().flat_map(|e| e.keys()));
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

    // The TOML profiles hold the same settings: serve.env with the profile's env over it.
    for (name, profile_env) in names.iter().zip(&profile_envs) {
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
