"""clef-tt's tt-model package against tt-model's own rules, as its source states them
(tenstorrent/tt-model-manager: tt_kernel/manifest.py, container_manifest.py, launchers.py,
build.py): the authored tt-model.yaml as `load_container_manifest` takes it (PyYAML safe_load,
ContainerManifest with extra keys forbidden, validate_semantics, the tt-dit-server launcher's
validate), the published tt_kernel_manifest.json as `Manifest.from_json` takes it, the one
being what `to_wire` renders from the other, and runtime.packages installing the wheel
packaging/build-wheel.sh builds. The rules are restated here (tt-model is not on PyPI); a few
broken variants must fail them, so the check is not vacuous.

usage: python tests/tt_model/check_package.py REPO_ROOT [WHEEL]   (needs PyYAML)
"""

import copy
import json
import os
import re
import sys

import tomllib
import yaml

# --- tt-model's tables (container_manifest.py, launchers.py, manifest.py) -------------------

SCHEMA = "5.1"
SUPPORTED_SCHEMAS = {"5", "5.1", "6"}
ARCHES = ("blackhole", "wormhole_b0")
KINDS = ("vllm-plugin", "vllm-fork", "tt-dit-server")
MESH_DEVICE_PRESETS = {
    "N150": (1, 1),
    "P100": (1, 1),
    "P150": (1, 1),
    "P150x2": (1, 2),
    "N300": (1, 2),
    "P300": (1, 2),
    "N150x4": (1, 4),
    "P150x4": (1, 4),
    "T3K": (1, 8),
    "P150x8": (1, 8),
    "P300x2": (1, 4),
    "QB2": (2, 2),
    "TG": (4, 8),
    "BH-Galaxy": (4, 8),
}
BOARD_CHIPS = {"p100": 1, "p150": 1, "n150": 1, "e150": 1, "p300": 2, "n300": 2}
SERVE_FIELDS = {
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
}
PROFILE_FIELDS = SERVE_FIELDS | {"name", "description"}
AUTHORED_FIELDS = {
    "schema",
    "schema_version",
    "repo",
    "name",
    "weights",
    "auxiliary_weights",
    "kind",
    "arch",
    "source",
    "image",
    "runtime",
    "serve",
    "serve_profiles",
    "default_profile",
    "card",
    "verify",
}
SOURCE_FIELDS = {"tt_metal", "code", "extra_code", "ubuntu", "python"}
GIT_SOURCE_FIELDS = {"repo", "ref", "sha"}
WEIGHTS_FIELDS = {"repo", "revision", "allow_patterns", "ignore_patterns"}
IMAGE_FIELDS = {"registry", "repository"}
CARD_FIELDS = {"description", "quickstart"}
CAPABILITY_FIELDS = {"tool_parser", "reasoning_parser"}
DIT_RUNTIME_KEYS = {"app", "packages", "lock", "mesh_shape_env"}
DIT_REQUIRED = ("hardware", "mesh_device")


class Refused(ValueError):
    pass


def need(cond, msg):
    if not cond:
        raise Refused(msg)


def only(mapping, allowed, where):
    need(isinstance(mapping, dict), f"{where} must be a mapping")
    extra = sorted(set(mapping) - set(allowed))
    need(not extra, f"{where}: unknown keys {extra} (extra keys are forbidden)")


def is_str(v):
    return isinstance(v, str)


def relative_paths(paths, where):
    need(isinstance(paths, list) and paths, f"{where} needs at least one path")
    for p in paths:
        need(
            is_str(p) and not p.startswith("/") and ".." not in p.split("/"),
            f"{where}: {p!r} must be relative",
        )


def chips(hardware):
    m = re.match(r"^(?P<base>[a-z]\d+[a-z]?)(?:x(?P<mult>\d+))?$", hardware.strip().lower())
    if not m:
        return None
    base = m.group("base")
    per = BOARD_CHIPS.get(base) or BOARD_CHIPS.get(re.sub(r"[a-z]$", "", base))
    return None if per is None else per * int(m.group("mult") or 1)


def mesh(value):
    t = re.fullmatch(r"\(\s*(\d+)\s*,\s*(\d+)\s*\)", value)
    if t:
        return int(t.group(1)), int(t.group(2))
    need(
        value in MESH_DEVICE_PRESETS,
        f"mesh_device {value!r} is neither a preset nor '(rows, cols)'",
    )
    return MESH_DEVICE_PRESETS[value]


def deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        elif v is not None and v != [] and v != {}:
            out[k] = v
    return out


def serve_settings(s, allowed, where):
    only(s, allowed, where)
    env = s.get("env", {})
    need(
        isinstance(env, dict) and all(is_str(k) and is_str(v) for k, v in env.items()),
        f"{where}.env must map strings to strings (quote numbers in YAML)",
    )
    if s.get("capabilities") is not None:
        only(s["capabilities"], CAPABILITY_FIELDS, f"{where}.capabilities")
    for key in ("port", "max_model_len", "max_num_seqs", "block_size", "server_timeout"):
        need(s.get(key) is None or type(s[key]) is int, f"{where}.{key} must be an integer")


def check_authored(y):
    """ContainerManifest.model_validate + validate_semantics + the kind's validate."""
    only(y, AUTHORED_FIELDS, "tt-model.yaml")
    for key in ("repo", "name", "weights", "arch", "source"):
        need(key in y, f"{key} is required")
    schema = y.get("schema", y.get("schema_version", SCHEMA))
    need(
        is_str(schema) and schema == SCHEMA, f"schema must be the string {SCHEMA!r}, got {schema!r}"
    )
    need(re.fullmatch(r"[a-z0-9][a-z0-9._-]*", y["name"]), f"name {y['name']!r} is not a slug")
    need("/" in y["repo"], "repo must be org/name")
    weights = y["weights"]
    if isinstance(weights, dict):
        only(weights, WEIGHTS_FIELDS, "weights")
        weights = weights["repo"]
    need(is_str(weights) and "/" in weights, "weights must be an org/name id")
    kind = y.get("kind", "vllm-plugin")
    need(kind in KINDS, f"kind {kind!r}")
    need(y["arch"] in ARCHES, f"arch {y['arch']!r}")
    src = y["source"]
    only(src, SOURCE_FIELDS, "source")
    for key in ("tt_metal", "code", "ubuntu", "python"):
        need(key in src, f"source.{key} is required")
    for key in ("ubuntu", "python"):
        need(is_str(src[key]), f"source.{key} must be a string (quote it in YAML)")
    if isinstance(src["tt_metal"], dict):
        only(src["tt_metal"], GIT_SOURCE_FIELDS, "source.tt_metal")
        need(
            src["tt_metal"].get("repo") and src["tt_metal"].get("ref"),
            "source.tt_metal needs repo and ref",
        )
    relative_paths(src["code"], "source.code")
    shipped = list(src["code"])
    for i, extra in enumerate(src.get("extra_code", [])):
        only(extra, {"root", "paths"}, f"source.extra_code[{i}]")
        if isinstance(extra["root"], dict):
            only(extra["root"], GIT_SOURCE_FIELDS, f"source.extra_code[{i}].root")
        relative_paths(extra.get("paths"), f"source.extra_code[{i}].paths")
        shipped += extra["paths"]
    only(y.get("image", {}), IMAGE_FIELDS, "image")
    if y.get("card") is not None:
        only(y["card"], CARD_FIELDS, "card")
    need(
        isinstance(y.get("verify", []), list) and all(is_str(v) for v in y.get("verify", [])),
        "verify: strings",
    )

    serve = y.get("serve", {})
    serve_settings(serve, SERVE_FIELDS, "serve")
    profiles = y.get("serve_profiles") or [{"name": "default"}]
    for p in profiles:
        serve_settings(p, PROFILE_FIELDS, f"serve_profiles[{p.get('name')}]")
        need(is_str(p.get("name")), "every serve profile needs a name")
    names = [p["name"] for p in profiles]
    need(len(set(names)) == len(names), f"duplicate serve profile names {names}")
    need(len(names) == 1 or y.get("default_profile"), "several profiles need a default_profile")
    need(
        y.get("default_profile") in (None, *names), f"default_profile {y.get('default_profile')!r}"
    )
    for p in profiles:
        merged = deep_merge(serve, p)
        for field in DIT_REQUIRED if kind == "tt-dit-server" else ():
            need(merged.get(field) is not None, f"profile {p['name']}: {field} is required")
        rows, cols = mesh(merged["mesh_device"])
        n = chips(merged["hardware"])
        need(n, f"profile {p['name']}: hardware {merged['hardware']!r} is not a board label")
        need(
            rows * cols == n,
            f"profile {p['name']}: {merged['mesh_device']} is {rows}x{cols}, {merged['hardware']} has {n} chips",
        )

    # launchers.TtDitServerLauncher.validate
    rt = y.get("runtime", {})
    need(isinstance(rt, dict), "runtime must be a mapping")
    need(
        not set(rt) - DIT_RUNTIME_KEYS,
        f"runtime keys {sorted(set(rt) - DIT_RUNTIME_KEYS)} are not valid for {kind}",
    )
    app = rt.get("app")
    need(is_str(app) and ":" in app, "runtime.app must be 'module.path:attribute'")
    top = app.split(":", 1)[0].split(".")[0]
    need(
        any(c.split("/")[0] == top for c in shipped),
        f"runtime.app lives under {top!r}, which no allowlist entry ships",
    )
    env_name = rt.get("mesh_shape_env")
    need(
        env_name is None
        or (is_str(env_name) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env_name)),
        "mesh_shape_env",
    )
    need(isinstance(rt.get("packages", []), list), "runtime.packages must be a list")
    return profiles, shipped


def check_wire(m):
    """Manifest.from_json: the schema gate and the models' shapes."""
    need(
        m.get("schema_version") in SUPPORTED_SCHEMAS, f"schema_version {m.get('schema_version')!r}"
    )
    need(m["schema_version"] == SCHEMA, "a container package is schema 5.1")
    for key in ("name", "tt_metal_version", "arch"):
        need(is_str(m.get(key)), f"{key} is required")
    need(
        isinstance(m.get("producer"), dict)
        and is_str(m["producer"].get("tt_kernel_version"))
        and is_str(m["producer"].get("created_at")),
        "producer",
    )
    e = m.get("entrypoint")
    need(
        e is None
        or (isinstance(e, dict) and is_str(e.get("class")) and is_str(e.get("arch_name"))),
        "entrypoint must be null or {class, arch_name}",
    )
    need(m.get("mesh") is None or isinstance(m["mesh"], dict), "mesh must be null or an object")
    c = m.get("container")
    need(isinstance(c, dict), "container is required for a container package")
    image = c.get("image")
    need(isinstance(image, dict) and is_str(image.get("tag")), "container.image.tag is required")
    need(
        image.get("digest") is None or re.fullmatch(r"sha256:[0-9a-f]{64}", image["digest"]),
        f"digest {image.get('digest')!r}: null or sha256:<hex> (an empty one never matches an image)",
    )
    if image.get("registry", "hf") == "hf":
        # No pull reference: the tag IS what `docker run` gets, as the tool's own tt-model/<name>:<id>.
        need(
            re.fullmatch(
                rf"tt-model/{re.escape(m['name'])}:[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}",
                image["tag"],
            ),
            f"image tag {image['tag']!r} is not an image reference tt-model/{m['name']}:<tag>",
        )
    serve_settings(c.get("serve", {}), SERVE_FIELDS, "container.serve")
    for p in c.get("serve_profiles", []):
        serve_settings(p, PROFILE_FIELDS, f"container.serve_profiles[{p.get('name')}]")
    need(
        c.get("default_profile") in [p["name"] for p in c.get("serve_profiles", [])],
        "default_profile",
    )


def check_agreement(y, m):
    """The published document is what to_wire renders from the authored one."""
    c = m["container"]
    weights = y["weights"] if isinstance(y["weights"], dict) else {"repo": y["weights"]}
    need(m["name"] == y["name"] and m["arch"] == y["arch"], "name/arch")
    need(
        m["weights"]["repo"] == weights["repo"]
        and m["weights"].get("revision") == weights.get("revision"),
        "weights",
    )
    default = y.get("default_profile") or y["serve_profiles"][0]["name"]
    merged = deep_merge(
        y.get("serve", {}), next(p for p in y["serve_profiles"] if p["name"] == default)
    )
    need(
        m["device_count"] == chips(merged["hardware"]),
        "device_count is the default profile's chips",
    )
    for key in ("entrypoint", "mesh", "resources", "capabilities"):
        need(m.get(key) is None, f"{key}: to_wire writes null")
    image = y.get("image", {})
    need(c["image"].get("registry", "hf") == image.get("registry", "hf"), "image.registry")
    need(c["image"].get("repository") == (image.get("repository") or y["name"]), "image.repository")
    for key in ("kind", "runtime", "serve", "serve_profiles", "default_profile", "verify"):
        need(c.get(key) == y.get(key), f"container.{key} differs from tt-model.yaml")
    for key, value in (y.get("card") or {}).items():
        need((c.get("card") or {}).get(key) == value, f"card.{key}")


def check_packages(y, root):
    """runtime.packages installs the wheel build-wheel.sh makes, from where code/ puts it."""
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        version = tomllib.load(f)["package"]["version"]
    with open(os.path.join(root, "packaging", "pyproject.toml"), "rb") as f:
        tag = tomllib.load(f)["tool"]["maturin"]["compatibility"]
    wheel = f"clef_tt-{version}-py3-none-{tag}_x86_64.whl"
    packages = y["runtime"]["packages"]
    shipped = [p for e in y["source"].get("extra_code", []) for p in e["paths"]] + y["source"][
        "code"
    ]
    refs = [p for p in packages if p.startswith("clef-tt @ file:///opt/tt-metal/")]
    need(len(refs) == 1, "runtime.packages must install the clef-tt wheel from /opt/tt-metal/")
    path = refs[0].removeprefix("clef-tt @ file:///opt/tt-metal/")
    need(os.path.basename(path) == wheel, f"{path}: build-wheel.sh makes {wheel}")
    need(
        os.path.dirname(path) in shipped,
        f"{os.path.dirname(path)} is not in the allowlist (code/ would not carry it)",
    )
    # One tt-metal in the image: tt-model builds source.tt_metal and installs it as ttnn; only
    # from a local checkout (build.resolve_metal_source) does that install carry the release
    # tag's version (0.81.1) rather than 0.0.0.dev0, and a ttnn in runtime.packages would
    # replace it with a second tt-metal.
    need(
        is_str(y["source"]["tt_metal"]),
        "source.tt_metal must be a local tt-metal checkout at v0.81.1 (a git source installs ttnn 0.0.0.dev0)",
    )
    need(
        not any(re.match(r"ttnn\b", p) for p in packages),
        "ttnn: the image's ttnn is the source.tt_metal build; a second one replaces it",
    )
    for module in ("uvicorn", "fastapi", "pydantic"):
        need(
            any(re.match(rf"{module}\b", p) for p in packages),
            f"{module}: tt-model's verify imports it",
        )
    need(
        not any(re.match(r"torch\b", p) for p in packages),
        "torch: tt-model adds tt-metal's pin itself",
    )
    for line in y.get("verify", []):
        compile(line, "<verify>", "exec")
    return wheel


def broken_variants(y, m):
    """Documents each rule with a variant it refuses."""

    def with_(doc, path, value):
        doc = copy.deepcopy(doc)
        node = doc
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return doc

    yield (
        "a string entrypoint",
        lambda: check_wire(with_(m, ["entrypoint"], "python -m uvicorn app:app")),
    )
    yield "an empty digest", lambda: check_wire(with_(m, ["container", "image", "digest"], ""))
    yield "a bare version tag", lambda: check_wire(with_(m, ["container", "image", "tag"], "0.1.0"))
    yield "schema 5.1 as a number", lambda: check_authored(with_(y, ["schema"], 5.1))
    yield "an unknown top-level key", lambda: check_authored(with_(y, ["serve_profile"], []))
    yield (
        "a number in serve.env",
        lambda: check_authored(with_(y, ["serve", "env", "CLEF_WORKERS"], 1)),
    )
    yield "the launcher not shipped", lambda: check_authored(with_(y, ["source", "extra_code"], []))
    yield (
        "P150x2 on p150x4",
        lambda: check_authored(with_(y, ["serve_profiles", 1, "mesh_device"], "P150x2")),
    )
    yield (
        "a runtime key of another kind",
        lambda: check_authored(with_(y, ["runtime", "wheels"], [])),
    )


def main():
    root = sys.argv[1]
    with open(os.path.join(root, "tt-model.yaml")) as f:
        y = yaml.safe_load(f)
    with open(os.path.join(root, "tt_kernel_manifest.json")) as f:
        m = json.load(f)
    profiles, shipped = check_authored(y)
    check_wire(m)
    check_agreement(y, m)
    wheel = check_packages(y, root)
    assert [p["name"] for p in profiles] == ["p150x2", "p150x4"]
    assert any(c.split("/")[0] == "launcher" for c in shipped)
    for what, attempt in broken_variants(y, m):
        try:
            attempt()
        except Refused:
            continue
        raise AssertionError(f"the check accepted {what}")
    if len(sys.argv) > 2:
        assert os.path.basename(sys.argv[2]) == wheel, (
            f"built {sys.argv[2]}, the package installs {wheel}"
        )
    print(
        f"tt-model package: tt-model.yaml and tt_kernel_manifest.json pass tt-model's rules; installs {wheel}"
    )


if __name__ == "__main__":
    main()
