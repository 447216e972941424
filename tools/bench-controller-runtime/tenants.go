package main

import (
	"context"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// The `tenants` workload's resource, as `examples/tenants.rs` installs it: a Job of
// tenants.actorcile.dev/v1 in any namespace, with the status every runtime of that example writes.

// TenantsGroupVersion is the Job resource's group and version.
var TenantsGroupVersion = schema.GroupVersion{Group: "tenants.actorcile.dev", Version: "v1"}

// AddTenantsToScheme registers Job and JobList.
var AddTenantsToScheme = (&scheme.Builder{GroupVersion: TenantsGroupVersion}).
	Register(&Job{}, &JobList{}).AddToScheme

// JobSpec is what the example writes; the reconcile reads none of it.
type JobSpec struct {
	N uint32 `json:"n"`
}

// Job is one object of the `tenants` workload.
type Job struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              JobSpec           `json:"spec,omitempty"`
	Status            BenchObjectStatus `json:"status,omitempty"`
}

// JobList is a list of them.
type JobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Job `json:"items"`
}

// DeepCopyInto copies j into out.
func (j *Job) DeepCopyInto(out *Job) {
	*out = *j
	j.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if j.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(j.Status.Conditions))
		for i := range j.Status.Conditions {
			j.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

// DeepCopyObject copies j as a runtime.Object.
func (j *Job) DeepCopyObject() runtime.Object {
	if j == nil {
		return nil
	}
	out := new(Job)
	j.DeepCopyInto(out)
	return out
}

// DeepCopyObject copies l as a runtime.Object.
func (l *JobList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := new(JobList)
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]Job, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}

// TenantsReconciler runs the `tenants` workload: an external call of `work`, then the Ready
// status, once per generation.
type TenantsReconciler struct {
	client.Client
	work       time.Duration
	reconciles *atomic.Uint64
}

// Reconcile is one reconcile of one Job.
func (r *TenantsReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.reconciles.Add(1)
	var job Job
	if err := r.Get(ctx, req.NamespacedName, &job); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// Not readyFor: the example's status schema may have no phase.
	if job.Status.ObservedGeneration == job.Generation &&
		meta.IsStatusConditionTrue(job.Status.Conditions, "Ready") {
		return ctrl.Result{}, nil
	}
	select {
	case <-time.After(r.work):
	case <-ctx.Done():
		return ctrl.Result{}, ctx.Err()
	}
	job.Status.markReady(job.Generation)
	return ctrl.Result{}, r.Status().Update(ctx, &job)
}
