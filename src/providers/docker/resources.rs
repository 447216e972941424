//! The networks and volumes a cluster's nodes name: created with the cluster's labels when
//! missing, removed (those of its labels only) after its last node.

use std::collections::HashMap;

use bollard::models::{NetworkCreateRequest, VolumeCreateRequest};
use bollard::query_parameters::{ListNetworksOptions, ListVolumesOptions, RemoveVolumeOptions};

use super::{DockerProvider, ProviderError};

impl DockerProvider {
    /// Network `name`, created with `cluster`'s labels if there is none of that name.
    pub(super) async fn ensure_network(
        &self,
        cluster: &str,
        name: &str,
    ) -> Result<(), ProviderError> {
        let options = ListNetworksOptions {
            filters: Some(HashMap::from([(
                "name".to_string(),
                vec![name.to_string()],
            )])),
        };
        let exists = |list: &[bollard::models::Network]| {
            list.iter().any(|n| n.name.as_deref() == Some(name))
        };
        let list = self
            .engine(
                "list networks",
                name,
                self.docker.list_networks(Some(options.clone())),
            )
            .await?;
        if exists(&list) {
            return Ok(());
        }
        let request = NetworkCreateRequest {
            name: name.to_string(),
            labels: Some(self.cluster_labels(cluster)),
            ..Default::default()
        };
        match self
            .engine("create network", name, self.docker.create_network(request))
            .await
        {
            Ok(_) => Ok(()),
            // Made meanwhile by another node of the cluster: then it is there.
            Err(e) => {
                let list = self
                    .engine(
                        "list networks",
                        name,
                        self.docker.list_networks(Some(options)),
                    )
                    .await?;
                if exists(&list) { Ok(()) } else { Err(e) }
            }
        }
    }

    /// Volume `name`, created with `cluster`'s labels if there is none of that name.
    pub(super) async fn ensure_volume(
        &self,
        cluster: &str,
        name: &str,
    ) -> Result<(), ProviderError> {
        let options = ListVolumesOptions {
            filters: Some(HashMap::from([(
                "name".to_string(),
                vec![name.to_string()],
            )])),
        };
        let exists = |list: bollard::models::VolumeListResponse| {
            list.volumes
                .unwrap_or_default()
                .iter()
                .any(|v| v.name == name)
        };
        let list = self
            .engine(
                "list volumes",
                name,
                self.docker.list_volumes(Some(options.clone())),
            )
            .await?;
        if exists(list) {
            return Ok(());
        }
        let request = VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(self.cluster_labels(cluster)),
            ..Default::default()
        };
        match self
            .engine("create volume", name, self.docker.create_volume(request))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let list = self
                    .engine(
                        "list volumes",
                        name,
                        self.docker.list_volumes(Some(options)),
                    )
                    .await?;
                if exists(list) { Ok(()) } else { Err(e) }
            }
        }
    }

    /// Remove the networks and volumes labelled with `cluster` (after its last node went).
    pub(super) async fn remove_cluster_resources(
        &self,
        cluster: &str,
    ) -> Result<(), ProviderError> {
        let networks = self
            .engine(
                "list networks",
                cluster,
                self.docker.list_networks(Some(ListNetworksOptions {
                    filters: Some(self.label_filter(cluster)),
                })),
            )
            .await?;
        for name in networks.into_iter().filter_map(|n| n.name) {
            match self
                .engine("remove network", &name, self.docker.remove_network(&name))
                .await
            {
                Err(e) if !Self::is_not_found(&e) => return Err(e),
                _ => {}
            }
        }
        let volumes = self
            .engine(
                "list volumes",
                cluster,
                self.docker.list_volumes(Some(ListVolumesOptions {
                    filters: Some(self.label_filter(cluster)),
                })),
            )
            .await?;
        for v in volumes.volumes.unwrap_or_default() {
            match self
                .engine(
                    "remove volume",
                    &v.name,
                    self.docker
                        .remove_volume(&v.name, None::<RemoveVolumeOptions>),
                )
                .await
            {
                Err(e) if !Self::is_not_found(&e) => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}
