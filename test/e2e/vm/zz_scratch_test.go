package vm

import (
	"context"
	"path/filepath"
	"testing"
	"time"
	"os"
)

func TestScratch(t *testing.T) {
	k, i, err := Artifacts(cacheDir(t))
	if err != nil { t.Fatal(err) }
	d := t.TempDir()
	// 1: bad netdev -> qemu exits; error shows log
	s := filepath.Join(d, "a.log")
	vm, err := Start(QEMUArgs(k, i, "tap,id=n0,fds=3:4,vhost=off", 2, Guest{}, s, true), nil, s)
	if err != nil { t.Fatal(err) }
	ctx, c := context.WithTimeout(context.Background(), 20*time.Second); defer c()
	t.Logf("1: %v", vm.WaitFor(ctx, MarkerUp))
	t.Logf("1 stop: %v %v", vm.Stop(), vm.Stop())
	// 2: user netdev, script with commas/quotes, rc=3, noTSO, 4 queues
	s = filepath.Join(d, "b.log")
	script := "echo 'a,b,,c \"q\"' $((1+2)); ls -d /sys/class/net/eth0/queues/*; cat /proc/cpuinfo | grep -c processor; exit 3"
	vm, err = Start(QEMUArgs(k, i, "user,id=n0", 1, Guest{IP: "10.0.2.15/24", Gateway: "10.0.2.2", Script: script}, s, true), nil, s)
	if err != nil { t.Fatal(err) }
	t.Logf("2: %v", vm.WaitFor(ctx, MarkerDone+"3"))
	t.Logf("2 serial: %s", vm.Serial())
	t.Logf("2 wait: %v", vm.Wait(ctx))
	// 3: Stop during boot
	s = filepath.Join(d, "c.log")
	vm, err = Start(QEMUArgs(k, i, "user,id=n0", 1, Guest{Script: "sleep 100"}, s, false), nil, s)
	if err != nil { t.Fatal(err) }
	time.Sleep(time.Second)
	st := time.Now()
	t.Logf("3 stop: %v in %v; waitfor after stop: %v", vm.Stop(), time.Since(st), vm.WaitFor(ctx, MarkerUp))
	// 4: timeout
	s = filepath.Join(d, "e.log")
	vm, err = Start(QEMUArgs(k, i, "user,id=n0", 1, Guest{Script: "sleep 100"}, s, false), nil, s)
	if err != nil { t.Fatal(err) }
	ctx2, c2 := context.WithTimeout(context.Background(), 5*time.Second); defer c2()
	t.Logf("4: %v", vm.WaitFor(ctx2, MarkerDone))
	t.Logf("4 stop: %v", vm.Stop())
	_ = os.Remove
}
