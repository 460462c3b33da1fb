package testutil

import (
	"reflect"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// FillFields sets every exported field of the struct ptr points to (and
// of structs within it) to a non-zero value, each number and string
// different, so that a conversion that drops or swaps a field shows in a
// round trip. It fails the test on a field kind it cannot fill, rather
// than leave a field zero and the round trip vacuous.
func FillFields(t testing.TB, ptr any) {
	t.Helper()
	n := 0
	fill(t, reflect.ValueOf(ptr).Elem(), &n, reflect.TypeOf(ptr).Elem().Name())
}

func fill(t testing.TB, v reflect.Value, n *int, path string) {
	t.Helper()
	*n++
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if f := v.Type().Field(i); f.IsExported() {
				fill(t, v.Field(i), n, path+"."+f.Name)
			}
		}
	case reflect.String:
		v.SetString("v" + strconv.Itoa(*n) + path)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), n, path)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(t, v.Index(0), n, path+"[0]")
	case reflect.Map:
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, n, path+"[key]")
		fill(t, e, n, path+"[value]")
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(k, e)
	default:
		t.Fatalf("FillFields: %s is a %s, which it cannot fill", path, v.Kind())
	}
}

// AllProtoFieldsSet fails the test for each field of m (and of messages
// within it) that is not populated: after converting a FillFields value,
// such a field is one the conversion forgot.
func AllProtoFieldsSet(t testing.TB, m proto.Message) {
	t.Helper()
	allSet(t, m.ProtoReflect(), string(m.ProtoReflect().Descriptor().Name()))
}

func allSet(t testing.TB, m protoreflect.Message, path string) {
	t.Helper()
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		p := path + "." + string(fd.Name())
		if !m.Has(fd) {
			t.Errorf("%s is not set by the conversion", p)
			continue
		}
		if fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap() {
			allSet(t, m.Get(fd).Message(), p)
		}
	}
}
