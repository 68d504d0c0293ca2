//! Request intake: any bytes through the body parser and the validator (with and without the
//! host limits) give a request or a 4xx error naming what is wrong; never a panic.
#![no_main]

use clef_tt::request::{parse_body, validate, HostLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_body(data) {
        Ok(value) => {
            for limits in [None, Some(&HostLimits::default())] {
                if let Err(e) = validate(&value, limits) {
                    assert!((400..500).contains(&e.status), "{e:?}");
                    assert!(!e.msg.is_empty());
                }
            }
        }
        Err(e) => assert!((400..500).contains(&e.status), "{e:?}"),
    }
});
