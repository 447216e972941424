//! Infrastructure providers (nodes of a cluster): the ksail contract — start, stop, list nodes,
//! list clusters, delete, and cluster status derived from node states. Implementations (a
//! Docker-API provider and a simulated one) come with the providers issue; provisioners use
//! them, and they know nothing of actors.
