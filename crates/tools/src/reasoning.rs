use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};
use toolmesh_core::{
    BackendError, CallContext, ToolAnnotations, ToolOutput, ToolSource, ToolSpec, Toolkit,
};
use toolmesh_workers::LocalTool;

use crate::BUILTIN_SOURCE;

/// Instructions of the reasoning toolkit, for the model.
pub const REASONING_INSTRUCTIONS: &str = "\
Think before you act: before calling any other tool, call `think` with what you know, what \
you still need, and the action you plan, with your confidence. After every tool result, call \
`analyze` on that result: say what it shows, whether it answers the task, and choose the next \
action: `continue` (more work is needed), `validate` (check the result before relying on it) \
or `final_answer` (you can answer now). Keep each thought short and concrete.";

/// Returns the reasoning toolkit and its tools.
pub fn reasoning_toolkit() -> (Toolkit, Vec<Arc<dyn LocalTool>>) {
    let toolkit = Toolkit {
        name: "reasoning".into(),
        description: "Structured thinking: record a reasoning step, analyze a result.".into(),
        instructions: REASONING_INSTRUCTIONS.into(),
        tools: vec!["think".into(), "analyze".into()],
    };
    (toolkit, vec![Arc::new(ThinkTool), Arc::new(AnalyzeTool)])
}

fn annotations() -> ToolAnnotations {
    ToolAnnotations {
        read_only: Some(true),
        destructive: Some(false),
        idempotent: Some(true),
        open_world: Some(false),
    }
}

/// `think`: records one reasoning step.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThinkTool;

#[derive(Deserialize)]
struct Thought {
    title: String,
    thought: String,
    action: Option<String>,
    confidence: Option<f64>,
}

#[async_trait::async_trait]
impl LocalTool for ThinkTool {
    fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(
            "think",
            "Record one reasoning step before acting: what you know, what is missing, and the \
             action you plan next. Has no side effects; the step is returned so it stays in \
             the conversation.",
            json!({
                "type": "object",
                "required": ["title", "thought"],
                "additionalProperties": false,
                "properties": {
                    "title": {"type": "string", "minLength": 1, "maxLength": 200,
                              "description": "A short title for this step."},
                    "thought": {"type": "string", "minLength": 1,
                                "description": "The reasoning itself."},
                    "action": {"type": "string",
                               "description": "The action you plan next, if any."},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1,
                                   "description": "How sure you are, from 0 to 1."}
                }
            }),
            ToolSource::local(BUILTIN_SOURCE),
        );
        spec.title = "Think".into();
        spec.annotations = annotations();
        spec.tags = vec!["reasoning".into()];
        spec
    }

    async fn call(&self, ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let step: Thought = serde_json::from_value(arguments.clone())
            .map_err(|error| BackendError::InvalidArguments(error.to_string()))?;
        let mut text = format!("Step recorded: {}\n{}", step.title, step.thought);
        if let Some(action) = &step.action {
            text.push_str(&format!("\nNext action: {action}"));
        }
        if let Some(confidence) = step.confidence {
            text.push_str(&format!("\nConfidence: {confidence:.2}"));
        }
        let mut structured = arguments;
        structured["session_id"] = json!(ctx.session_id);
        Ok(ToolOutput {
            content: vec![toolmesh_core::ContentPart::Text(text)],
            structured: Some(structured),
            is_error: false,
        })
    }
}

/// `analyze`: evaluates a result and returns the next action.
#[derive(Debug, Default, Clone, Copy)]
pub struct AnalyzeTool;

#[derive(Deserialize)]
struct Analysis {
    title: String,
    result: String,
    analysis: String,
    next_action: String,
    confidence: Option<f64>,
}

#[async_trait::async_trait]
impl LocalTool for AnalyzeTool {
    fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(
            "analyze",
            "Analyze the result of the last action: what it shows, whether it answers the \
             task, and the next action: continue, validate, or final_answer.",
            json!({
                "type": "object",
                "required": ["title", "result", "analysis", "next_action"],
                "additionalProperties": false,
                "properties": {
                    "title": {"type": "string", "minLength": 1, "maxLength": 200,
                              "description": "A short title for this analysis."},
                    "result": {"type": "string", "description": "The result being analyzed."},
                    "analysis": {"type": "string", "minLength": 1,
                                 "description": "What the result shows and whether it suffices."},
                    "next_action": {"type": "string",
                                    "enum": ["continue", "validate", "final_answer"],
                                    "description": "continue: more work is needed; validate: \
                                                    check before relying on it; final_answer: \
                                                    answer now."},
                    "confidence": {"type": "number", "minimum": 0, "maximum": 1}
                }
            }),
            ToolSource::local(BUILTIN_SOURCE),
        );
        spec.title = "Analyze".into();
        spec.annotations = annotations();
        spec.tags = vec!["reasoning".into()];
        spec.output_schema = Some(Arc::new(json!({
            "type": "object",
            "required": ["title", "next_action"],
            "properties": {
                "title": {"type": "string"},
                "next_action": {"enum": ["continue", "validate", "final_answer"]},
                "confidence": {"type": ["number", "null"]}
            }
        })));
        spec.validate_output = true;
        spec
    }

    async fn call(&self, _ctx: &CallContext, arguments: Value) -> Result<ToolOutput, BackendError> {
        let analysis: Analysis = serde_json::from_value(arguments)
            .map_err(|error| BackendError::InvalidArguments(error.to_string()))?;
        let guidance = match analysis.next_action.as_str() {
            "continue" => "More work is needed: plan the next step with think.",
            "validate" => {
                "Check this result (another source, a test, a recomputation) before relying on it."
            }
            _ => "You have what you need: give the final answer now.",
        };
        let text = format!(
            "Analysis: {}\nResult: {}\n{}\nNext action: {} — {guidance}",
            analysis.title, analysis.result, analysis.analysis, analysis.next_action
        );
        Ok(ToolOutput {
            content: vec![toolmesh_core::ContentPart::Text(text)],
            structured: Some(json!({
                "title": analysis.title,
                "next_action": analysis.next_action,
                "confidence": analysis.confidence,
                "guidance": guidance,
            })),
            is_error: false,
        })
    }
}
