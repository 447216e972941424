//! Conversion between the versions of a custom resource, through one hub version
//! (controller-runtime's Hub and Convertible, typed): each other version (a spoke) converts
//! to the hub and back, so `n` versions need `n - 1` pairs of conversions, not `n²`.
//!
//! The runtime answers the API server's `ConversionReview`: each object is decoded as its
//! version's type, converted to the hub, and from the hub to the version asked for. Its
//! `metadata` is carried over as it arrived, whatever the conversion did with it (the API server
//! refuses a conversion that changes metadata other than labels and annotations), and its
//! `apiVersion` is set to the one asked for.
//!
//! ```
//! use actorcile::webhooks::{Conversion, Convertible};
//! # mod v1 {
//! #   #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! #   #[kube(group = "example.com", version = "v1", kind = "App", namespaced)]
//! #   pub struct AppSpec { pub replicas: u32, pub image: String }
//! # }
//! # mod v1alpha1 {
//! #   #[derive(kube::CustomResource, Clone, Debug, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
//! #   #[kube(group = "example.com", version = "v1alpha1", kind = "App", namespaced)]
//! #   pub struct AppSpec { pub size: u32, pub image: String }
//! # }
//!
//! // v1 is the hub; v1alpha1 called `replicas` `size`.
//! impl Convertible<v1::App> for v1alpha1::App {
//!     fn to_hub(self) -> v1::App {
//!         v1::App::new("", v1::AppSpec { replicas: self.spec.size, image: self.spec.image })
//!     }
//!     fn from_hub(hub: v1::App) -> Self {
//!         v1alpha1::App::new("", v1alpha1::AppSpec { size: hub.spec.replicas, image: hub.spec.image })
//!     }
//! }
//!
//! let conversion = Conversion::<v1::App>::hub().spoke::<v1alpha1::App>();
//! assert_eq!(conversion.versions(), ["v1", "v1alpha1"]);
//! ```

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, WebhookClientConfig, WebhookConversion,
};
use kube::Resource;
use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::admission::panic_message;

/// A version of a kind that converts to and from the hub `H` (the version every conversion
/// goes through). Metadata need not be copied: the runtime keeps the object's own.
pub trait Convertible<H>: Sized {
    /// This version as the hub.
    fn to_hub(self) -> H;
    /// The hub as this version (dropping what this version cannot hold).
    fn from_hub(hub: H) -> Self;
}

/// A version's conversions with the hub, on JSON.
#[derive(Clone, Copy)]
struct Spoke {
    to_hub: fn(Value) -> Result<Value, String>,
    from_hub: fn(Value) -> Result<Value, String>,
}

/// The conversions of one kind's versions, through the hub `H`; see the [module](self).
pub struct Conversion<H> {
    group: String,
    kind: String,
    plural: String,
    hub: String,
    spokes: BTreeMap<String, Spoke>,
    _hub: PhantomData<fn() -> H>,
}

impl<H> Clone for Conversion<H> {
    fn clone(&self) -> Self {
        Conversion {
            group: self.group.clone(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
            hub: self.hub.clone(),
            spokes: self.spokes.clone(),
            _hub: PhantomData,
        }
    }
}

impl<H> std::fmt::Debug for Conversion<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversion")
            .field("group", &self.group)
            .field("kind", &self.kind)
            .field("hub", &self.hub)
            .field("versions", &self.spokes.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A CRD's versions cannot all be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConversionError {
    /// A version the CRD serves or stores has no conversion to the hub.
    #[error("{crd}: version {version} has no conversion to the hub version {hub}")]
    NoPathToHub {
        /// The CRD's name.
        crd: String,
        /// The version without a conversion.
        version: String,
        /// The hub version.
        hub: String,
    },
    /// The conversions are for another kind than the CRD's, or the CRD does not have the hub's
    /// version.
    #[error("{crd}: the conversions are for {kind}.{group} with hub version {hub}")]
    OtherKind {
        /// The CRD's name.
        crd: String,
        /// The conversions' kind.
        kind: String,
        /// The conversions' group.
        group: String,
        /// The hub version.
        hub: String,
    },
}

fn json<T: Serialize>(value: &T) -> Result<Value, String> {
    serde_json::to_value(value).map_err(|e| format!("does not encode: {e}"))
}

fn typed<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| format!("at {}: {}", e.path(), e.inner()))
}

impl<H> Conversion<H>
where
    H: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
{
    /// The conversions of `H`'s kind, with `H`'s version as the hub.
    pub fn hub() -> Self {
        let hub = H::version(&()).into_owned();
        let mut spokes = BTreeMap::new();
        // The hub goes through its own type too, so that an object that does not decode as
        // its version is refused the same way on every path.
        spokes.insert(
            hub.clone(),
            Spoke {
                to_hub: |v| json(&typed::<H>(v)?),
                from_hub: |v| json(&typed::<H>(v)?),
            },
        );
        Conversion {
            group: H::group(&()).into_owned(),
            kind: H::kind(&()).into_owned(),
            plural: H::plural(&()).into_owned(),
            hub,
            spokes,
            _hub: PhantomData,
        }
    }

    /// Adds version `S`, converted through the hub.
    ///
    /// # Panics
    ///
    /// If `S` is another kind than the hub's (a programming error, found at start-up).
    pub fn spoke<S>(mut self) -> Self
    where
        S: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Convertible<H>,
    {
        assert!(
            S::group(&()) == self.group && S::kind(&()) == self.kind,
            "Conversion::spoke: {} is not a version of {}.{}",
            S::kind(&()),
            self.kind,
            self.group
        );
        let spoke = Spoke {
            to_hub: |v| json(&typed::<S>(v)?.to_hub()),
            from_hub: |v| json(&S::from_hub(typed::<H>(v)?)),
        };
        self.spokes.insert(S::version(&()).into_owned(), spoke);
        self
    }
}

impl<H> Conversion<H> {
    /// The versions it converts, the hub's among them, in order.
    pub fn versions(&self) -> Vec<&str> {
        self.spokes.keys().map(String::as_str).collect()
    }

    /// The kind's API group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The name of the kind's CRD: `<plural>.<group>`.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }

    /// That every version of `crd` converts to the hub, and that `crd` is this kind's.
    pub fn check(&self, crd: &CustomResourceDefinition) -> Result<(), ConversionError> {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let versions: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
        if crd.spec.group != self.group
            || crd.spec.names.kind != self.kind
            || !versions.contains(&self.hub.as_str())
        {
            return Err(ConversionError::OtherKind {
                crd: name,
                kind: self.kind.clone(),
                group: self.group.clone(),
                hub: self.hub.clone(),
            });
        }
        match versions.iter().find(|v| !self.spokes.contains_key(**v)) {
            Some(version) => Err(ConversionError::NoPathToHub {
                crd: name,
                version: version.to_string(),
                hub: self.hub.clone(),
            }),
            None => Ok(()),
        }
    }

    /// `crd` with its `conversion` stanza: strategy `Webhook`, review version `v1`, the
    /// webhook reached through `client` (a Service or a URL, with the CA bundle), after
    /// [`check`](Self::check)ing it.
    pub fn apply_to(
        &self,
        mut crd: CustomResourceDefinition,
        client: WebhookClientConfig,
    ) -> Result<CustomResourceDefinition, ConversionError> {
        self.check(&crd)?;
        crd.spec.conversion = Some(CustomResourceConversion {
            strategy: "Webhook".into(),
            webhook: Some(WebhookConversion {
                client_config: Some(client),
                conversion_review_versions: vec!["v1".into()],
            }),
        });
        Ok(crd)
    }

    /// `object` (of one of the versions) as `api_version` (`<group>/<version>`).
    pub fn convert(&self, object: Value, api_version: &str) -> Result<Value, String> {
        let from = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .ok_or("the object has no apiVersion")?
            .to_owned();
        let version_of = |api_version: &str| -> Result<String, String> {
            match api_version.split_once('/') {
                Some((group, version)) if group == self.group => Ok(version.to_owned()),
                _ => Err(format!(
                    "{api_version} is not a version of group {}",
                    self.group
                )),
            }
        };
        let (from_version, to_version) = (version_of(&from)?, version_of(api_version)?);
        if from_version == to_version {
            return Ok(object);
        }
        let spoke = |version: &str| {
            self.spokes
                .get(version)
                .copied()
                .ok_or_else(|| format!("no conversion for version {version} of {}", self.kind))
        };
        let (source, target) = (spoke(&from_version)?, spoke(&to_version)?);
        let metadata = object.get("metadata").cloned();
        let hub = (source.to_hub)(object).map_err(|e| format!("{from} {e}"))?;
        let mut converted = (target.from_hub)(hub).map_err(|e| format!("{api_version} {e}"))?;
        let fields = converted
            .as_object_mut()
            .ok_or("the conversion did not give an object")?;
        fields.insert("apiVersion".into(), api_version.into());
        fields.insert("kind".into(), self.kind.clone().into());
        match metadata {
            Some(metadata) => fields.insert("metadata".into(), metadata),
            None => fields.remove("metadata"),
        };
        Ok(converted)
    }

    /// The answer to a `ConversionReview` (its bytes): every object converted, or the first
    /// failure (a conversion that panics is a failure, never a crash).
    pub fn review(&self, body: &[u8]) -> Value {
        let response = match serde_json::from_slice::<ConversionReview>(body)
            .map_err(|e| e.to_string())
            .and_then(|review| ConversionRequest::from_review(review).map_err(|e| e.to_string()))
        {
            Ok(request) => {
                let desired = request.desired_api_version.clone();
                let objects = request.objects.clone();
                let response = ConversionResponse::for_request(request);
                let converted = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    objects
                        .into_iter()
                        .map(|object| self.convert(object, &desired))
                        .collect::<Result<Vec<_>, _>>()
                }))
                .unwrap_or_else(|panic| {
                    let what = panic_message(&*panic).to_owned();
                    tracing::error!(panic = what, "conversion panicked");
                    Err(format!("the conversion failed: {what}"))
                });
                match converted {
                    Ok(objects) => response.success(objects),
                    Err(message) => response.failure(Status::failure(&message, "Invalid")),
                }
            }
            Err(e) => ConversionResponse::invalid(Status::failure(
                &format!("the ConversionReview does not decode: {e}"),
                "BadRequest",
            )),
        };
        let mut review = serde_json::to_value(response.into_review()).unwrap_or(Value::Null);
        if let Some(fields) = review.as_object_mut() {
            fields.insert("apiVersion".into(), "apiextensions.k8s.io/v1".into());
            fields.insert("kind".into(), "ConversionReview".into());
        }
        review
    }
}

/// A conversion with its hub type erased.
pub(crate) trait ErasedConversion: Send + Sync {
    fn review(&self, body: &[u8]) -> Value;
    fn group(&self) -> &str;
    fn kind(&self) -> &str;
    fn crd_name(&self) -> String;
    fn apply_to(
        &self,
        crd: CustomResourceDefinition,
        client: WebhookClientConfig,
    ) -> Result<CustomResourceDefinition, ConversionError>;
}

impl<H: 'static> ErasedConversion for Conversion<H> {
    fn review(&self, body: &[u8]) -> Value {
        Conversion::review(self, body)
    }
    fn group(&self) -> &str {
        &self.group
    }
    fn kind(&self) -> &str {
        &self.kind
    }
    fn crd_name(&self) -> String {
        Conversion::crd_name(self)
    }
    fn apply_to(
        &self,
        crd: CustomResourceDefinition,
        client: WebhookClientConfig,
    ) -> Result<CustomResourceDefinition, ConversionError> {
        Conversion::apply_to(self, crd, client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionNames, CustomResourceDefinitionSpec,
        CustomResourceDefinitionVersion,
    };
    use proptest::prelude::*;
    use serde_json::json;

    mod v1 {
        /// The hub: what v1alpha1 held, and a colour it did not.
        #[derive(
            kube::CustomResource,
            Clone,
            Debug,
            PartialEq,
            serde::Deserialize,
            serde::Serialize,
            schemars::JsonSchema,
        )]
        #[kube(
            group = "conv.example.com",
            version = "v1",
            kind = "Gadget",
            namespaced
        )]
        pub struct GadgetSpec {
            pub replicas: u32,
            pub image: String,
            pub color: Option<String>,
        }
    }

    mod v1alpha1 {
        #[derive(
            kube::CustomResource,
            Clone,
            Debug,
            PartialEq,
            serde::Deserialize,
            serde::Serialize,
            schemars::JsonSchema,
        )]
        #[kube(
            group = "conv.example.com",
            version = "v1alpha1",
            kind = "Gadget",
            namespaced,
            derive = "PartialEq"
        )]
        pub struct GadgetSpec {
            pub size: u32,
            pub image: String,
        }
    }

    impl Convertible<v1::Gadget> for v1alpha1::Gadget {
        fn to_hub(self) -> v1::Gadget {
            if self.spec.image == "panic" {
                panic!("no image called panic");
            }
            v1::Gadget::new(
                "",
                v1::GadgetSpec {
                    replicas: self.spec.size,
                    image: self.spec.image,
                    color: None,
                },
            )
        }
        fn from_hub(hub: v1::Gadget) -> Self {
            v1alpha1::Gadget::new(
                "",
                v1alpha1::GadgetSpec {
                    size: hub.spec.replicas,
                    image: hub.spec.image,
                },
            )
        }
    }

    fn conversion() -> Conversion<v1::Gadget> {
        Conversion::<v1::Gadget>::hub().spoke::<v1alpha1::Gadget>()
    }

    fn crd(kind: &str, versions: &[&str]) -> CustomResourceDefinition {
        CustomResourceDefinition {
            metadata: kube::core::ObjectMeta {
                name: Some("gadgets.conv.example.com".into()),
                ..Default::default()
            },
            spec: CustomResourceDefinitionSpec {
                group: "conv.example.com".into(),
                names: CustomResourceDefinitionNames {
                    kind: kind.into(),
                    plural: "gadgets".into(),
                    ..Default::default()
                },
                scope: "Namespaced".into(),
                versions: versions
                    .iter()
                    .map(|v| CustomResourceDefinitionVersion {
                        name: (*v).into(),
                        served: true,
                        storage: *v == "v1",
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            status: None,
        }
    }

    fn client() -> WebhookClientConfig {
        WebhookClientConfig {
            url: Some("https://webhooks.example.com/convert".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_crd_with_every_version_converted_gets_the_webhook_stanza() {
        let crd = conversion()
            .apply_to(crd("Gadget", &["v1alpha1", "v1"]), client())
            .unwrap();
        let stanza = crd.spec.conversion.unwrap();
        assert_eq!(stanza.strategy, "Webhook");
        let webhook = stanza.webhook.unwrap();
        assert_eq!(webhook.conversion_review_versions, ["v1"]);
        assert_eq!(
            webhook.client_config.unwrap().url.as_deref(),
            Some("https://webhooks.example.com/convert")
        );
    }

    #[test]
    fn a_version_without_a_conversion_is_refused_by_name() {
        let error = conversion()
            .apply_to(crd("Gadget", &["v1alpha1", "v1", "v2"]), client())
            .unwrap_err();
        assert_eq!(
            error,
            ConversionError::NoPathToHub {
                crd: "gadgets.conv.example.com".into(),
                version: "v2".into(),
                hub: "v1".into(),
            }
        );
        assert!(error.to_string().contains("version v2 has no conversion"));
    }

    #[test]
    fn a_crd_of_another_kind_or_without_the_hub_is_refused() {
        let other = conversion().check(&crd("Widget", &["v1"])).unwrap_err();
        assert!(matches!(other, ConversionError::OtherKind { .. }));
        let no_hub = conversion()
            .check(&crd("Gadget", &["v1alpha1"]))
            .unwrap_err();
        assert!(matches!(no_hub, ConversionError::OtherKind { .. }));
    }

    #[test]
    fn conversion_keeps_the_objects_metadata_and_names_the_asked_version() {
        let object = json!({
            "apiVersion": "conv.example.com/v1alpha1",
            "kind": "Gadget",
            "metadata": {"name": "g", "namespace": "ns", "uid": "u-1", "labels": {"a": "b"}},
            "spec": {"size": 3, "image": "app:1"},
        });
        let hub = conversion()
            .convert(object.clone(), "conv.example.com/v1")
            .unwrap();
        assert_eq!(hub["apiVersion"], "conv.example.com/v1");
        assert_eq!(hub["kind"], "Gadget");
        assert_eq!(hub["metadata"], object["metadata"]);
        assert_eq!(
            hub["spec"],
            json!({"replicas": 3, "image": "app:1", "color": null})
        );
        let back = conversion()
            .convert(hub, "conv.example.com/v1alpha1")
            .unwrap();
        assert_eq!(back, object);
    }

    #[test]
    fn an_object_that_does_not_decode_as_its_version_fails_with_the_field() {
        let object = json!({
            "apiVersion": "conv.example.com/v1alpha1",
            "kind": "Gadget",
            "metadata": {"name": "g"},
            "spec": {"size": "three", "image": "app:1"},
        });
        let error = conversion()
            .convert(object, "conv.example.com/v1")
            .unwrap_err();
        assert!(error.contains("spec.size"), "{error}");
        let error = conversion()
            .convert(
                json!({"apiVersion": "other.example.com/v1", "kind": "Gadget"}),
                "conv.example.com/v1",
            )
            .unwrap_err();
        assert!(
            error.contains("not a version of group conv.example.com"),
            "{error}"
        );
    }

    fn review(objects: Value, desired: &str) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "r-1", "desiredAPIVersion": desired, "objects": objects},
        }))
        .unwrap()
    }

    #[test]
    fn a_review_converts_every_object_and_a_panic_is_a_failure() {
        let object = |image: &str| {
            json!({
                "apiVersion": "conv.example.com/v1alpha1",
                "kind": "Gadget",
                "metadata": {"name": image},
                "spec": {"size": 1, "image": image},
            })
        };
        let answer = conversion().review(&review(
            json!([object("a"), object("b")]),
            "conv.example.com/v1",
        ));
        assert_eq!(answer["kind"], "ConversionReview");
        assert_eq!(answer["response"]["uid"], "r-1");
        assert_eq!(answer["response"]["result"]["status"], "Success");
        let converted = answer["response"]["convertedObjects"].as_array().unwrap();
        assert_eq!(converted.len(), 2);
        assert_eq!(converted[1]["spec"]["replicas"], 1);

        let answer = conversion().review(&review(
            json!([object("a"), object("panic")]),
            "conv.example.com/v1",
        ));
        assert_eq!(answer["response"]["result"]["status"], "Failure");
        let message = answer["response"]["result"]["message"].as_str().unwrap();
        assert!(message.contains("no image called panic"), "{message}");

        let answer = conversion().review(b"not json");
        assert_eq!(answer["response"]["result"]["status"], "Failure");
    }

    proptest! {
        /// spoke -> hub -> spoke is the identity on what the spoke holds, through the JSON the
        /// API server sends.
        #[test]
        fn spoke_to_hub_and_back_is_identity(
            size in any::<u32>(),
            image in "[ -~]{0,40}",
            name in "[a-z][a-z0-9-]{0,20}",
        ) {
            prop_assume!(image != "panic");
            let mut spoke = v1alpha1::Gadget::new(&name, v1alpha1::GadgetSpec { size, image });
            spoke.metadata.namespace = Some("ns".into());
            let object = serde_json::to_value(&spoke).unwrap();
            let hub = conversion().convert(object, "conv.example.com/v1").unwrap();
            let back = conversion().convert(hub, "conv.example.com/v1alpha1").unwrap();
            prop_assert_eq!(serde_json::from_value::<v1alpha1::Gadget>(back).unwrap(), spoke);
        }

        /// hub -> spoke -> hub keeps every field the spoke can hold.
        #[test]
        fn hub_to_spoke_and_back_keeps_what_the_spoke_holds(
            replicas in any::<u32>(),
            image in "[ -~]{0,40}",
            color in proptest::option::of("[a-z]{1,8}"),
        ) {
            let hub = v1::Gadget::new("g", v1::GadgetSpec { replicas, image, color });
            let object = serde_json::to_value(&hub).unwrap();
            let spoke = conversion().convert(object, "conv.example.com/v1alpha1").unwrap();
            let back = conversion().convert(spoke, "conv.example.com/v1").unwrap();
            let back: v1::Gadget = serde_json::from_value(back).unwrap();
            prop_assert_eq!(back.spec.replicas, hub.spec.replicas);
            prop_assert_eq!(back.spec.image, hub.spec.image);
            prop_assert_eq!(back.spec.color, None);
        }
    }
}
