package main

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// The bench resource, as `actorcile bench` installs it (cli/src/bench/workload.rs), typed the
// way controller-gen types a kind; DeepCopy written out here instead of generated.

// GroupVersion is the bench resource's group and version.
var GroupVersion = schema.GroupVersion{Group: "bench.actorcile.dev", Version: "v1"}

// AddToScheme registers BenchObject and BenchObjectList.
var AddToScheme = (&scheme.Builder{GroupVersion: GroupVersion}).
	Register(&BenchObject{}, &BenchObjectList{}).AddToScheme

// BenchObjectSpec is what the bench's drivers write; the workloads here read none of it.
type BenchObjectSpec struct {
	StampMicros *uint64 `json:"stampMicros,omitempty"`
	LastUpdate  bool    `json:"lastUpdate,omitempty"`
	DependsOn   *string `json:"dependsOn,omitempty"`
}

// BenchObjectStatus is the status every runtime of the bench writes: a phase, the Ready
// condition and the generation it is for.
type BenchObjectStatus struct {
	Phase              string             `json:"phase,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
}

// BenchObject is one bench object.
type BenchObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              BenchObjectSpec   `json:"spec,omitempty"`
	Status            BenchObjectStatus `json:"status,omitempty"`
}

// BenchObjectList is a list of them.
type BenchObjectList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BenchObject `json:"items"`
}

// DeepCopyInto copies o into out.
func (o *BenchObject) DeepCopyInto(out *BenchObject) {
	*out = *o
	out.TypeMeta = o.TypeMeta
	o.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if o.Spec.StampMicros != nil {
		v := *o.Spec.StampMicros
		out.Spec.StampMicros = &v
	}
	if o.Spec.DependsOn != nil {
		v := *o.Spec.DependsOn
		out.Spec.DependsOn = &v
	}
	if o.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(o.Status.Conditions))
		for i := range o.Status.Conditions {
			o.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

// DeepCopy copies o.
func (o *BenchObject) DeepCopy() *BenchObject {
	if o == nil {
		return nil
	}
	out := new(BenchObject)
	o.DeepCopyInto(out)
	return out
}

// DeepCopyObject copies o as a runtime.Object.
func (o *BenchObject) DeepCopyObject() runtime.Object { return o.DeepCopy() }

// DeepCopyObject copies l as a runtime.Object.
func (l *BenchObjectList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := new(BenchObjectList)
	*out = *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]BenchObject, len(l.Items))
		for i := range l.Items {
			l.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
