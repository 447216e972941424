//! The guard's lock as its condition states it (`provisioners::Lock::of`): the condition is
//! written by other replicas and readable by anyone who can edit the object's status, so any
//! reason and message is a lock or none, never a panic; a lock read back from the runtime's own
//! wording of it is the same lock (its time to the millisecond, as written).

#![no_main]

use actorcile::provisioners::Lock;
use actorcile::status::Condition;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (bool, &str)| {
    let (locked, message) = input;
    let condition = Condition {
        type_: "Task".into(),
        status: "Unknown".into(),
        reason: if locked { "Locked" } else { "Done" }.into(),
        message: message.into(),
        last_transition_time: None,
        observed_generation: None,
    };
    let Some(lock) = Lock::of(&condition) else {
        return;
    };
    assert!(locked, "only a Locked condition is a lock: {message:?}");
    let written = format!(
        "held by {} until {:.3}",
        lock.holder, lock.until
    );
    let again = Lock::of(&Condition {
        message: written.clone(),
        ..condition
    })
    .unwrap_or_else(|| panic!("the runtime's own wording {written:?} reads as no lock"));
    assert_eq!(again.holder, lock.holder, "{written:?}");
    assert_eq!(
        again.until.as_millisecond(),
        lock.until.as_millisecond(),
        "{written:?}"
    );
});
