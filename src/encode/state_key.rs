//! The routing key of a decision (`x-clef-state-key`): a digest of what makes up the state
//! piece of the prompt — the state as the prompt renders it and the media placed before it — so
//! a balancer hashing the key sends repeats of a state to the replica whose prefix cache holds it.
//!
//! The digest, for a client library to compute the same key: SHA-256, as 64 lowercase hex
//! digits, over the UTF-8 bytes of the rendered state — a string state as it is; any other
//! JSON value as Python's `json.dumps(state, ensure_ascii=False, separators=(",", ":"),
//! sort_keys=True)` prints it — followed, for every image and then every video frame in the
//! request's order, by one 0x00 byte and the image string as sent (an image sent as
//! `{"content_type", "base64"}` counts as the data URL `data:<content_type>;base64,<base64>`).
//! A text-only request's key is `sha256(state)` of its text (empty `images` and `videos` lists
//! add nothing), which is what `deploy/haproxy/haproxy.cfg` computes for clients that send no
//! key.

use super::render;
use crate::request::SystemOneRequest;
use sha2::{Digest, Sha256};

/// The request header a client may send (any string: the balancer hashes it) and the response
/// header the server answers every decision with (its own digest of the request).
pub const STATE_KEY_HEADER: &str = "x-clef-state-key";

/// The key of a validated request.
pub fn state_key(req: &SystemOneRequest) -> String {
    let mut digest = Sha256::new();
    digest.update(render(&req.state).as_bytes());
    for media in req.images.iter().chain(req.videos.iter().flatten()) {
        digest.update([0u8]);
        digest.update(media.as_bytes());
    }
    digest
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::state_key;
    use crate::request::{parse_body, validate};

    fn key(body: &str) -> String {
        state_key(&validate(&parse_body(body.as_bytes()).unwrap(), None).unwrap())
    }

    const Q: &str = r#""questions":{"q":{"type":"noul","instructions":"?"}}"#;

    #[test]
    fn a_text_state_is_keyed_by_the_sha256_of_its_text() {
        // sha256("abc"), FIPS 180-2 appendix B.1.
        assert_eq!(
            key(&format!(r#"{{"model":"m","state":"abc",{Q}}}"#)),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_text_state_is_keyed_by_the_sha256_of_its_utf8_whatever_the_json_escapes() {
        // Digests from coreutils `sha256sum` over the bytes (printf 'é中😀', printf
        // 'a"b\\c\n\tA\x01'): what a balancer or client hashes, the state as text.
        let cases = [
            (
                r#""é中😀""#,
                "aabae3418ff6346303d27c710ec789e76a3d57634026fc011ac96be24144615a",
            ),
            (
                r#""\u00e9\u4e2d\ud83d\ude00""#,
                "aabae3418ff6346303d27c710ec789e76a3d57634026fc011ac96be24144615a",
            ),
            (
                r#""a\"b\\c\n\t\u0041\u0001""#,
                "161bd699e197a7d46c8203327a639eb74db7d84a8f51753fd990514782421d49",
            ),
            (
                r#""""#,
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            ),
        ];
        for (state, want) in cases {
            for media in ["", r#","images":[]"#, r#","images":null,"videos":[]"#] {
                let body = format!(r#"{{"model":"m","state":{state}{media},{Q}}}"#);
                assert_eq!(key(&body), want, "{body}");
            }
        }
    }

    #[test]
    fn json_states_key_their_sorted_compact_rendering_and_media_count() {
        let a = key(&format!(
            r#"{{"model":"m","state":{{"b":1,"a":[2.5]}},{Q}}}"#
        ));
        let b = key(&format!(
            r#"{{"model":"m","state":{{"a":[2.5],"b":1}},{Q}}}"#
        ));
        let text = key(&format!(
            r#"{{"model":"m","state":"{{\"a\":[2.5],\"b\":1}}",{Q}}}"#
        ));
        assert_eq!(a, b);
        assert_eq!(a, text, "the rendered text is what is hashed");
        let image = key(&format!(
            r#"{{"model":"m","state":"abc","images":["x"],{Q}}}"#
        ));
        let video = key(&format!(
            r#"{{"model":"m","state":"abc","videos":[["x"]],{Q}}}"#
        ));
        assert_eq!(image, video, "a frame is keyed as an image in that place");
        assert_ne!(image, key(&format!(r#"{{"model":"m","state":"abc",{Q}}}"#)));
    }
}
