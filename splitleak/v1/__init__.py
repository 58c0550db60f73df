"""Generated protocol stubs of splitleak.v1."""
