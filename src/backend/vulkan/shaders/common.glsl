// Shared declarations: arrays are reached through buffer device addresses;
// each shader's push constant is the address of its argument block.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer I32 { int v[]; };

// Grid-stride loops: the grid's x size is capped at 65535 workgroups.
#define GRID_STRIDE (gl_NumWorkGroups.x * gl_WorkGroupSize.x)
#define GRID_ID (gl_GlobalInvocationID.x)

float sigmoid_f(float x) { return 1.0 / (1.0 + exp(-x)); }
