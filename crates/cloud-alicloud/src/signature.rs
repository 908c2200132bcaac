//! The Alibaba Cloud RPC signature (SignatureVersion 1.0, HMAC-SHA1), as the vendored SDK's
//! `buildRpcStringToSign` (`sdk/auth/rpc_signature_composer.go`) computes it:
//!
//! 1. every request parameter except `Signature`, sorted by key (byte order);
//! 2. key and value percent-encoded per RFC 3986 ([`percent_encode`]: only `A-Z a-z 0-9 - _ . ~`
//!    stay, a space is `%20`, never `+`), joined as `k=v` with `&` (an empty value keeps its
//!    `=`, as `SignatureType=` does);
//! 3. `StringToSign = <METHOD>&%2F&<percent_encode(canonical query)>`;
//! 4. `Signature = base64(HMAC-SHA1(key = AccessKeySecret + "&", StringToSign))`.
//!
//! Pure functions over plain data; the emulator in the sandbox verifies with its own
//! implementation, so a shared mistake cannot hide. Beside them, the two fresh values every
//! signed request carries: its `Timestamp` ([`timestamp_now`]) and `SignatureNonce`
//! ([`nonce`]).

use std::collections::BTreeMap;

use base64::Engine as _;

/// Percent-encodes `value` per RFC 3986 over its UTF-8 bytes: unreserved characters
/// (`A-Z a-z 0-9 - _ . ~`) stay, every other byte becomes `%XX` with upper-case hex. This is
/// the SDK's `url.Values.Encode` followed by `+`→`%20`, `*`→`%2A`, `%7E`→`~`.
pub fn percent_encode(value: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(value.len());
    for &byte in value.as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    out
}

/// The canonical query: `params` (already without `Signature`) sorted by key and encoded with
/// [`percent_encode`].
pub fn canonical_query(params: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (key, value) in params {
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(&percent_encode(key));
        out.push('=');
        out.push_str(&percent_encode(value));
    }
    out
}

/// `<METHOD>&%2F&<percent_encode(canonical query)>`. A `Signature` entry in `params` is left
/// out, so a re-signed retry cannot sign its previous signature.
pub fn string_to_sign(method: &str, params: &BTreeMap<String, String>) -> String {
    let canonical = if params.contains_key("Signature") {
        let mut without = params.clone();
        without.remove("Signature");
        canonical_query(&without)
    } else {
        canonical_query(params)
    };
    format!("{method}&%2F&{}", percent_encode(&canonical))
}

/// `base64(HMAC-SHA1(secret + "&", string_to_sign))`.
pub fn sign(access_key_secret: &str, string_to_sign: &str) -> String {
    let key = ring::hmac::Key::new(
        ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        format!("{access_key_secret}&").as_bytes(),
    );
    let tag = ring::hmac::sign(&key, string_to_sign.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(tag.as_ref())
}

/// Now, in the SDK's layout `2006-01-02T15:04:05Z` (UTC, no fraction).
pub(crate) fn timestamp_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A fresh `SignatureNonce`: a random UUIDv4 as 32 lower-case hex digits, no dashes
/// (the SDK's `utils.GetUUIDV4`).
pub(crate) fn nonce() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        // The system RNG never fails on Linux; the clock keeps the nonce unique regardless.
        let nanos = jiff::Timestamp::now().as_nanosecond().to_le_bytes();
        bytes.copy_from_slice(&nanos);
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_uuid4_hex_and_fresh() {
        let a = nonce();
        let b = nonce();
        assert_eq!(a.len(), 32);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(&a[12..13], "4");
        assert_ne!(a, b);
    }

    #[test]
    fn timestamps_have_no_fraction() {
        let t = timestamp_now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z'));
        assert_eq!(&t[10..11], "T");
    }

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Alibaba's published example (GET, `DescribeRegions`, secret `testsecret`).
    #[test]
    fn signs_the_documented_example() {
        let p = params(&[
            ("AccessKeyId", "testid"),
            ("Action", "DescribeRegions"),
            ("Format", "XML"),
            ("SignatureMethod", "HMAC-SHA1"),
            ("SignatureNonce", "3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf"),
            ("SignatureVersion", "1.0"),
            ("Timestamp", "2016-02-23T12:46:24Z"),
            ("Version", "2014-05-26"),
        ]);
        let sts = string_to_sign("GET", &p);
        assert_eq!(
            sts,
            "GET&%2F&AccessKeyId%3Dtestid%26Action%3DDescribeRegions%26Format%3DXML\
             %26SignatureMethod%3DHMAC-SHA1%26SignatureNonce%3D3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf\
             %26SignatureVersion%3D1.0%26Timestamp%3D2016-02-23T12%253A46%253A24Z%26Version%3D2014-05-26"
        );
        assert_eq!(sign("testsecret", &sts), "OLeaidS1JvxuMvnyHOwuJ+uX5qY=");
    }

    /// A request shaped like cluster-autoscaler's `ScaleWithAdjustment` (POST, JSON
    /// `ActivityMetadata`, the empty `SignatureType=`).
    #[test]
    fn signs_a_cluster_autoscaler_shaped_request() {
        let p = params(&[
            ("AccessKeyId", "testid"),
            ("Action", "ScaleWithAdjustment"),
            (
                "ActivityMetadata",
                r#"{"cluster-autoscaler/alicloud/managed":"true"}"#,
            ),
            ("AdjustmentType", "TotalCapacity"),
            ("AdjustmentValue", "3"),
            ("Format", "JSON"),
            ("RegionId", "cn-hangzhou"),
            ("ScalingGroupId", "asg-123"),
            ("SignatureMethod", "HMAC-SHA1"),
            ("SignatureNonce", "0123456789abcdef0123456789abcdef"),
            ("SignatureType", ""),
            ("SignatureVersion", "1.0"),
            ("SyncActivity", "true"),
            ("Timestamp", "2024-01-02T03:04:05Z"),
            ("Version", "2014-08-28"),
        ]);
        let sts = string_to_sign("POST", &p);
        assert!(sts.contains("%26SignatureType%3D%26"), "{sts}");
        assert_eq!(sign("testsecret", &sts), "bRFpRV5dti4XTikGTW7WCrO4NZI=");
    }

    /// The SDK's own known answers (`sdk/auth/rpc_signature_composer_test.go`
    /// `TestRpcSignatureComposer`): a common request (GET, `Format=JSON`, empty `Action` and
    /// `Version`) signed at "mock date" with nonce `MOCK_UUID`, with an AccessKey and then
    /// with an STS token; and `buildRpcStringToSign` on a value full of reserved characters.
    #[test]
    fn signs_the_sdk_composer_test_requests() {
        let mut p = params(&[
            ("Version", ""),
            ("Action", ""),
            ("Format", "JSON"),
            ("Timestamp", "mock date"),
            ("SignatureMethod", "HMAC-SHA1"),
            ("SignatureVersion", "1.0"),
            ("SignatureType", ""),
            ("SignatureNonce", "MOCK_UUID"),
            ("AccessKeyId", "accessKeyId"),
            ("RegionId", "regionId"),
        ]);
        assert_eq!(
            sign("accessKeySecret", &string_to_sign("GET", &p)),
            "7loPmFjvDnzOVnQeQNj85S6nFGY="
        );
        p.insert("SecurityToken".into(), "accessKeyStsToken".into());
        assert_eq!(
            sign("accessKeySecret", &string_to_sign("GET", &p)),
            "5Nxdcler+ihqWqv0Hr2On4PsBf4="
        );
        let p = params(&[("key", "value"), ("q", "http://domain/?q=value&q2=value2")]);
        assert_eq!(
            string_to_sign("GET", &p),
            "GET&%2F&key%3Dvalue%26q%3Dhttp%253A%252F%252Fdomain%252F%253Fq%253Dvalue%2526q2%253Dvalue2"
        );
        assert_eq!(string_to_sign("GET", &BTreeMap::new()), "GET&%2F&");
    }

    #[test]
    fn percent_encoding_follows_rfc3986() {
        assert_eq!(percent_encode("a b"), "a%20b");
        assert_eq!(percent_encode("a*b"), "a%2Ab");
        assert_eq!(percent_encode("a~b"), "a~b");
        assert_eq!(percent_encode("a/b"), "a%2Fb");
        assert_eq!(percent_encode("a+b"), "a%2Bb");
        assert_eq!(percent_encode("100%"), "100%25");
        assert_eq!(percent_encode("-_.AZaz09"), "-_.AZaz09");
        assert_eq!(percent_encode("é中"), "%C3%A9%E4%B8%AD");
        assert_eq!(percent_encode(""), "");
    }

    /// The same parameters through a stdlib-only copy of the SDK's composer (Go 1.26:
    /// `url.Values.Encode`, the three replacements, `url.QueryEscape`) gave this
    /// StringToSign and, with secret `secret`, this signature.
    #[test]
    fn edge_cases_match_the_sdk_composer() {
        let p = params(&[
            ("Action", "DescribeScalingGroups"),
            ("Space", "a b"),
            ("Star", "a*b"),
            ("Tilde", "a~b"),
            ("Slash", "a/b"),
            ("Plus", "a+b"),
            ("Percent", "100%"),
            ("Unicode", "é中"),
            ("Reserved", "=&?:@,;$!'()#[]"),
            ("Empty", ""),
            ("Json", r#"{"k":"v w"}"#),
            ("InstanceId.1", "i-1"),
            ("a", "lower sorts after upper"),
        ]);
        let sts = string_to_sign("POST", &p);
        assert_eq!(
            sts,
            "POST&%2F&Action%3DDescribeScalingGroups%26Empty%3D%26InstanceId.1%3Di-1\
             %26Json%3D%257B%2522k%2522%253A%2522v%2520w%2522%257D%26Percent%3D100%2525\
             %26Plus%3Da%252Bb%26Reserved%3D%253D%2526%253F%253A%2540%252C%253B%2524%2521%2527%2528%2529%2523%255B%255D\
             %26Slash%3Da%252Fb%26Space%3Da%2520b%26Star%3Da%252Ab%26Tilde%3Da~b\
             %26Unicode%3D%25C3%25A9%25E4%25B8%25AD%26a%3Dlower%2520sorts%2520after%2520upper"
        );
        assert_eq!(sign("secret", &sts), "z5aTAoaw6sBanugYrjUYz159pUA=");
    }

    #[test]
    fn a_previous_signature_is_not_signed() {
        let mut p = params(&[("Action", "X"), ("Version", "1")]);
        let before = string_to_sign("POST", &p);
        p.insert("Signature".into(), "old".into());
        assert_eq!(string_to_sign("POST", &p), before);
    }
}
