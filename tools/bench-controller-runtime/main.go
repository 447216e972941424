// Command bench-controller-runtime runs the `operator` and `status` workloads of `actorcile bench`
// under controller-runtime, written the way a controller-runtime user writes them: a typed
// BenchObject, a Reconciler on a manager with its default options (its cache, its default
// controller options and queue), the finalizer added and removed with controllerutil and
// Update, the child ConfigMap server-side applied, the status written with Status().Update.
// The `tenants` workload (tenants.go) is examples/tenants.rs's: Jobs in every namespace that
// match a label selector, each reconcile an external call and then the Ready status.
//
// actorcile's bench starts it as a child process once the bench objects exist (the tenants
// example, before it creates them), reads nothing from it while it runs (the caller's own
// observer watches the objects), stops it with SIGTERM, and reads the one JSON line it then
// prints on stdout: its reconciles, its API requests and its CPU time and peak resident memory.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

const (
	// finalizer is the one the other runtimes' `operator` sides put on every object.
	finalizer = "bench.actorcile.dev/cleanup"
	// fieldOwner is this side's field manager for server-side apply.
	fieldOwner = "bench-controller-runtime"
	// childSuffix ends a child ConfigMap's name (the parent's name comes first).
	childSuffix = "-config"
)

// Reconciler runs one workload.
type Reconciler struct {
	client.Client
	workload   string
	reconciles *atomic.Uint64
}

// Reconcile is one reconcile of one BenchObject.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.reconciles.Add(1)
	var obj BenchObject
	if err := r.Get(ctx, req.NamespacedName, &obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if r.workload == "operator" {
		if !obj.DeletionTimestamp.IsZero() {
			return ctrl.Result{}, r.cleanUp(ctx, &obj)
		}
		if controllerutil.AddFinalizer(&obj, finalizer) {
			if err := r.Update(ctx, &obj); err != nil {
				return ctrl.Result{}, err
			}
		}
		if err := r.applyChild(ctx, &obj); err != nil {
			return ctrl.Result{}, err
		}
	}
	if obj.Status.readyFor(obj.Generation) {
		return ctrl.Result{}, nil
	}
	obj.Status.markReady(obj.Generation)
	return ctrl.Result{}, r.Status().Update(ctx, &obj)
}

// applyChild server-side applies obj's child ConfigMap, owned by obj.
func (r *Reconciler) applyChild(ctx context.Context, obj *BenchObject) error {
	child := corev1ac.ConfigMap(obj.Name+childSuffix, obj.Namespace).
		WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion(GroupVersion.String()).
			WithKind("BenchObject").
			WithName(obj.Name).
			WithUID(obj.UID).
			WithController(true).
			WithBlockOwnerDeletion(true)).
		WithData(map[string]string{"parent": obj.Name})
	return r.Apply(ctx, child, client.FieldOwner(fieldOwner), client.ForceOwnership)
}

// cleanUp deletes obj's child and then removes the finalizer.
func (r *Reconciler) cleanUp(ctx context.Context, obj *BenchObject) error {
	if !controllerutil.ContainsFinalizer(obj, finalizer) {
		return nil
	}
	child := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: obj.Name + childSuffix, Namespace: obj.Namespace,
	}}
	if err := r.Delete(ctx, child); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	controllerutil.RemoveFinalizer(obj, finalizer)
	return r.Update(ctx, obj)
}

// readyFor: the status already says Ready for generation.
func (s *BenchObjectStatus) readyFor(generation int64) bool {
	return s.Phase == "Ready" && s.ObservedGeneration == generation &&
		meta.IsStatusConditionTrue(s.Conditions, "Ready")
}

// markReady makes the status say Ready for generation.
func (s *BenchObjectStatus) markReady(generation int64) {
	s.Phase = "Ready"
	s.ObservedGeneration = generation
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{
		Type:               "Ready",
		Status:             metav1.ConditionTrue,
		Reason:             "Provisioned",
		Message:            "provisioned",
		ObservedGeneration: generation,
	})
}

// counting counts the requests a client sends (a watch counts once), and its status writes.
type counting struct {
	next         http.RoundTripper
	requests     *atomic.Uint64
	statusWrites *atomic.Uint64
}

func (c counting) RoundTrip(req *http.Request) (*http.Response, error) {
	c.requests.Add(1)
	if req.Method != http.MethodGet && strings.HasSuffix(req.URL.Path, "/status") {
		c.statusWrites.Add(1)
	}
	return c.next.RoundTrip(req)
}

// Report is the JSON line printed at exit.
type Report struct {
	Reconciles   uint64  `json:"reconciles"`
	APIRequests  uint64  `json:"api_requests"`
	StatusWrites uint64  `json:"status_writes"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
}

func main() {
	// A flag set of its own: controller-runtime registers --kubeconfig on the global one.
	flags := flag.NewFlagSet("bench-controller-runtime", flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "the cluster's kubeconfig (required)")
	namespace := flags.String("namespace", "", "the namespace of the bench objects (required)")
	workload := flags.String("workload", "operator", "operator, status or tenants")
	concurrency := flags.Int("concurrency", 64, "MaxConcurrentReconciles")
	selector := flags.String("selector", "", "tenants: the label selector of the Jobs (every namespace)")
	work := flags.Duration("work", 2*time.Millisecond, "tenants: the external call each reconcile makes")
	_ = flags.Parse(os.Args[1:])
	known := *workload == "operator" || *workload == "status" || *workload == "tenants"
	if *kubeconfig == "" || !known || (*namespace == "" && *workload != "tenants") {
		flags.Usage()
		os.Exit(2)
	}
	opts := options{
		workload: *workload, namespace: *namespace, concurrency: *concurrency,
		selector: *selector, work: *work,
	}
	if err := run(*kubeconfig, opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench-controller-runtime:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	workload, namespace, selector string
	concurrency                   int
	work                          time.Duration
}

func run(kubeconfig string, o options) error {
	log.SetLogger(logr.Discard())
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	// No client-side rate limit, as kube-rs has none: client-go's default (5 requests per
	// second, bursts of 10) would measure the limiter, not the runtime.
	config.QPS = -1
	var requests, statusWrites atomic.Uint64
	config.Wrap(func(next http.RoundTripper) http.RoundTripper {
		return counting{next: next, requests: &requests, statusWrites: &statusWrites}
	})

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := AddToScheme(scheme); err != nil {
		return err
	}
	if err := AddTenantsToScheme(scheme); err != nil {
		return err
	}
	var cacheOptions cache.Options
	if o.workload == "tenants" {
		selected, err := labels.Parse(o.selector)
		if err != nil {
			return fmt.Errorf("the selector %q: %w", o.selector, err)
		}
		cacheOptions.ByObject = map[client.Object]cache.ByObject{&Job{}: {Label: selected}}
	} else {
		cacheOptions.DefaultNamespaces = map[string]cache.Config{o.namespace: {}}
	}
	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cacheOptions,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	var reconciles atomic.Uint64
	var b *builder.Builder
	var r interface {
		Reconcile(context.Context, ctrl.Request) (ctrl.Result, error)
	}
	if o.workload == "tenants" {
		b = ctrl.NewControllerManagedBy(mgr).For(&Job{})
		r = &TenantsReconciler{Client: mgr.GetClient(), work: o.work, reconciles: &reconciles}
	} else {
		b = ctrl.NewControllerManagedBy(mgr).For(&BenchObject{})
		r = &Reconciler{Client: mgr.GetClient(), workload: o.workload, reconciles: &reconciles}
	}
	err = b.WithOptions(controller.Options{MaxConcurrentReconciles: o.concurrency}).Complete(r)
	if err != nil {
		return fmt.Errorf("creating the controller: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return err
	}
	seconds := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return json.NewEncoder(os.Stdout).Encode(Report{
		Reconciles:   reconciles.Load(),
		APIRequests:  requests.Load(),
		StatusWrites: statusWrites.Load(),
		CPUSeconds:   seconds(usage.Utime) + seconds(usage.Stime),
		PeakRSSBytes: usage.Maxrss * 1024,
	})
}
