//! The client API stays compatible with the latest release's, checked by
//! machine rather than by review: `proto/deadbolt.proto` against the copy
//! kept in `compat/<release>/` (build.rs compiles both to descriptors).
//!
//! Why these rules: a gRPC client decodes by field number and type, and an
//! HTTP/JSON client by field name; a call, message, field or enum value it
//! knows must keep meaning the same thing. Additions are always fine.
//! Removal is fine only after a deprecation period: the released proto
//! marked the thing `[deprecated = true]` (`docs/upgrading.md`). A
//! breaking change needs a new `CLIENT_API` number and a new package
//! (`deadbolt.v2`), which this test then compares against nothing of v1.

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{
    DescriptorProto, EnumDescriptorProto, FileDescriptorSet, ServiceDescriptorProto,
};
use std::collections::HashMap;

fn descriptors(bytes: &[u8]) -> FileDescriptorSet {
    FileDescriptorSet::decode(bytes).expect("protoc's descriptor set decodes")
}

fn current() -> FileDescriptorSet {
    descriptors(include_bytes!(concat!(env!("OUT_DIR"), "/current.bin")))
}

fn released() -> FileDescriptorSet {
    descriptors(include_bytes!(concat!(env!("OUT_DIR"), "/released.bin")))
}

/// Every message (nested ones included), enum and service, by full name.
#[derive(Default)]
struct Index<'a> {
    messages: HashMap<String, &'a DescriptorProto>,
    enums: HashMap<String, &'a EnumDescriptorProto>,
    services: HashMap<String, &'a ServiceDescriptorProto>,
}

fn index(set: &FileDescriptorSet) -> Index<'_> {
    fn add<'a>(index: &mut Index<'a>, scope: &str, message: &'a DescriptorProto) {
        let name = format!("{scope}.{}", message.name());
        for nested in &message.nested_type {
            add(index, &name, nested);
        }
        for nested in &message.enum_type {
            index
                .enums
                .insert(format!("{name}.{}", nested.name()), nested);
        }
        index.messages.insert(name, message);
    }
    let mut index = Index::default();
    for file in &set.file {
        let scope = format!(".{}", file.package());
        for message in &file.message_type {
            add(&mut index, &scope, message);
        }
        for nested in &file.enum_type {
            index
                .enums
                .insert(format!("{scope}.{}", nested.name()), nested);
        }
        for service in &file.service {
            index
                .services
                .insert(format!("{scope}.{}", service.name()), service);
        }
    }
    index
}

/// What in `new` breaks a client of `old`, one line each.
fn breaking_changes(old: &FileDescriptorSet, new: &FileDescriptorSet) -> Vec<String> {
    let (old, new) = (index(old), index(new));
    let mut broken = Vec::new();
    for (name, old_message) in &old.messages {
        let deprecated = old_message.options.as_ref().is_some_and(|o| o.deprecated());
        let Some(new_message) = new.messages.get(name) else {
            if !deprecated {
                broken.push(format!(
                    "message {name} was removed without being deprecated first"
                ));
            }
            continue;
        };
        for field in &old_message.field {
            let field_deprecated = field.options.as_ref().is_some_and(|o| o.deprecated());
            let same_number = new_message
                .field
                .iter()
                .find(|f| f.number() == field.number());
            let what = format!("{name}.{} (field {})", field.name(), field.number());
            match same_number {
                None if deprecated || field_deprecated => {
                    let reserved = new_message
                        .reserved_range
                        .iter()
                        .any(|r| (r.start()..r.end()).contains(&field.number()));
                    if !reserved {
                        broken.push(format!("{what} was removed without reserving its number"));
                    }
                }
                None => broken.push(format!("{what} was removed without being deprecated first")),
                Some(now) if now.name() != field.name() => broken.push(format!(
                    "{what} was renamed to {} (JSON clients read fields by name)",
                    now.name()
                )),
                Some(now)
                    if now.r#type() != field.r#type() || now.type_name() != field.type_name() =>
                {
                    broken.push(format!(
                        "{what} changed type from {:?} {} to {:?} {}",
                        field.r#type(),
                        field.type_name(),
                        now.r#type(),
                        now.type_name()
                    ))
                }
                Some(now)
                    if (now.label() == Label::Repeated) != (field.label() == Label::Repeated)
                        || now.proto3_optional() != field.proto3_optional() =>
                {
                    broken.push(format!(
                        "{what} changed between repeated, optional and singular"
                    ))
                }
                Some(_) => {}
            }
        }
    }
    for (name, old_enum) in &old.enums {
        let Some(new_enum) = new.enums.get(name) else {
            broken.push(format!("enum {name} was removed"));
            continue;
        };
        for value in &old_enum.value {
            let deprecated = value.options.as_ref().is_some_and(|o| o.deprecated());
            let now = new_enum.value.iter().find(|v| v.number() == value.number());
            match now {
                None if deprecated => {}
                None => broken.push(format!(
                    "{name}.{} ({}) was removed without being deprecated first",
                    value.name(),
                    value.number()
                )),
                Some(now) if now.name() != value.name() => broken.push(format!(
                    "{name}.{} ({}) was renamed to {}",
                    value.name(),
                    value.number(),
                    now.name()
                )),
                Some(_) => {}
            }
        }
    }
    for (name, old_service) in &old.services {
        let Some(new_service) = new.services.get(name) else {
            broken.push(format!("service {name} was removed"));
            continue;
        };
        for method in &old_service.method {
            let deprecated = method.options.as_ref().is_some_and(|o| o.deprecated());
            let what = format!("{name}/{}", method.name());
            match new_service
                .method
                .iter()
                .find(|m| m.name() == method.name())
            {
                None if deprecated => {}
                None => broken.push(format!("{what} was removed without being deprecated first")),
                Some(now)
                    if now.input_type() != method.input_type()
                        || now.output_type() != method.output_type()
                        || now.client_streaming() != method.client_streaming()
                        || now.server_streaming() != method.server_streaming() =>
                {
                    broken.push(format!("{what} changed its request, response or streaming"))
                }
                Some(_) => {}
            }
        }
    }
    broken.sort();
    broken
}

#[test]
fn the_proto_keeps_every_call_field_and_value_of_the_latest_release() {
    let broken = breaking_changes(&released(), &current());
    assert!(
        broken.is_empty(),
        "proto/deadbolt.proto breaks clients of the latest release:\n  {}\n\
         Deprecate first and remove in a later release, or add instead of changing \
         (docs/upgrading.md, \"Client API\").",
        broken.join("\n  ")
    );
}

fn message_mut<'a>(set: &'a mut FileDescriptorSet, name: &str) -> &'a mut DescriptorProto {
    set.file[0]
        .message_type
        .iter_mut()
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("no message {name}"))
}

fn service_mut<'a>(set: &'a mut FileDescriptorSet, name: &str) -> &'a mut ServiceDescriptorProto {
    set.file[0]
        .service
        .iter_mut()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("no service {name}"))
}

/// A breaking change planted in a copy of the descriptors: what it is, how
/// to plant it, and a piece of the line the check must report.
type Plant = (&'static str, fn(&mut FileDescriptorSet), &'static str);

/// The check must be able to fail: each kind of breaking change, planted
/// in a copy of the current descriptors, is reported.
#[test]
fn each_kind_of_breaking_change_is_caught() {
    let base = current();
    let plants: [Plant; 7] = [
        (
            "a field renumbered",
            |set| message_mut(set, "AcquireRequest").field[0].number = Some(99),
            "was removed without being deprecated first",
        ),
        (
            "a field retyped",
            |set| {
                let message = message_mut(set, "AcquireResponse");
                let token = message.field.iter_mut().find(|f| f.name() == "token");
                token.unwrap().set_type(Type::String);
            },
            "changed type",
        ),
        (
            "a field renamed",
            |set| message_mut(set, "HealthResponse").field[0].name = Some("id".to_owned()),
            "was renamed to id",
        ),
        (
            "a field made repeated",
            |set| message_mut(set, "HealthResponse").field[0].set_label(Label::Repeated),
            "changed between repeated",
        ),
        (
            "a message removed",
            |set| {
                set.file[0]
                    .message_type
                    .retain(|m| m.name() != "CheckTokenRequest")
            },
            "message .deadbolt.v1.CheckTokenRequest was removed",
        ),
        (
            "a call removed",
            |set| {
                service_mut(set, "Deadbolt")
                    .method
                    .retain(|m| m.name() != "CheckToken")
            },
            "Deadbolt/CheckToken was removed",
        ),
        (
            "a call's request changed",
            |set| {
                let service = service_mut(set, "Deadbolt");
                let release = service.method.iter_mut().find(|m| m.name() == "Release");
                release.unwrap().input_type = Some(".deadbolt.v1.AcquireRequest".to_owned());
            },
            "Deadbolt/Release changed its request",
        ),
    ];
    for (what, plant, expected) in plants {
        let mut changed = base.clone();
        plant(&mut changed);
        let broken = breaking_changes(&base, &changed);
        assert!(
            broken.iter().any(|line| line.contains(expected)),
            "{what}: expected a line with {expected:?}, got {broken:#?}"
        );
    }
}

#[test]
fn additions_and_deprecated_removals_are_compatible() {
    let base = current();
    let mut added = base.clone();
    let health = message_mut(&mut added, "HealthResponse");
    let mut extra = health.field[0].clone();
    extra.name = Some("brand_new".to_owned());
    extra.number = Some(999);
    extra.json_name = Some("brandNew".to_owned());
    health.field.push(extra);
    assert_eq!(breaking_changes(&base, &added), Vec::<String>::new());

    // The release deprecated a field; the next removes it and reserves its number.
    let mut deprecated = base.clone();
    let health = message_mut(&mut deprecated, "HealthResponse");
    health.field[0].options = Some(prost_types::FieldOptions {
        deprecated: Some(true),
        ..Default::default()
    });
    let number = health.field[0].number();
    let mut removed = deprecated.clone();
    message_mut(&mut removed, "HealthResponse").field.remove(0);
    assert_eq!(
        breaking_changes(&deprecated, &removed).len(),
        1,
        "removed but not reserved"
    );
    message_mut(&mut removed, "HealthResponse")
        .reserved_range
        .push(prost_types::descriptor_proto::ReservedRange {
            start: Some(number),
            end: Some(number + 1),
        });
    assert_eq!(
        breaking_changes(&deprecated, &removed),
        Vec::<String>::new()
    );
}
